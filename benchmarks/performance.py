"""Run the simulator and agent benchmarks; keep each one's output verbatim in results/performance.md.

    python -m benchmarks.performance [--out results/performance.md] [--quick] [--only MODULES]

Each benchmark is a script of this folder that interleaves the variants it compares and
prints its own figures and ratios (min / median / max); this only runs them one after the
other, as separate processes, and writes what each printed as its own section of the page
(benchmarks/report.py), beside the command and the machine. Other sections (the
coordinator's, `make bench-coordinator`) and the prose are left as they are. --quick passes
each benchmark's own small settings (a smoke run, not figures to quote) and writes to
out/performance-quick.md, never over the committed page.

A benchmark that fails (non-zero exit) keeps its previous section: its error goes to the
terminal, not to the page; the others still run, and the command then exits 1 naming the
failed ones, so that `make performance` fails too.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.report import machine, write_section

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "results" / "performance.md"
# Smoke figures (one repetition, small settings) must not replace the committed ones: they go
# under out/, as a sweep page that would drop runs goes to results/.../local (simulator.report.page_dir).
QUICK_PAGE = REPO / "out" / "performance-quick.md"


@dataclass(frozen=True)
class Bench:
    title: str
    args: tuple[str, ...]
    quick: tuple[str, ...]
    what: str
    section: str = ""  # the page's section name; default: the module's name

    @property
    def name(self) -> str:
        return self.section or self.args[0].rsplit(".", 1)[-1]


BENCHES = (
    Bench("Simulator: the cache and fast trainers against plain sequential and per-device torch loops, "
          "and the rooflines",
          ("benchmarks.sim_speed", "--reps", "7"), ("benchmarks.sim_speed", "--reps", "1", "--workloads", "synthetic"),
          "Issue 10's goal: >= 3x the sequential loop on MNIST (MLP, 100 devices, batch 10, E = 20) and >= 15x on "
          "SYNTHETIC (logistic regression, 50 devices, batch 20); issue 18's for the cache trainer: >= 0.65 of the "
          "compute roofline, >= 3x sequential and ahead of the torch per-device loop (torchloop) on MNIST. The "
          "rooflines are printed with the bytes and FLOPs per device-step assumed."),
    Bench("Simulator: whole rounds with the paper traces' participation and evaluation",
          ("benchmarks.sim_speed", "--reps", "7", "--workloads", "mnist", "--participation", "traces", "--evaluate"),
          ("benchmarks.sim_speed", "--reps", "1", "--workloads", "mnist", "--participation", "traces", "--evaluate",
           "--variants", "cache,sequential,torchloop"),
          "Issue 18's goals, stated on whole rounds: the cache trainer at >= 0.65 of the compute roofline (the "
          "round's FLOPs, training and evaluation, at the sgemm rate measured in the same repetitions), >= 3x the "
          "sequential autograd loop and ahead of the torch per-device loop (torchloop), each variant timed with the "
          "aggregate applied and evaluated on the 10k test images.",
          section="sim_speed_rounds"),
    Bench("Simulator: E in epochs, ragged work against equal work",
          ("benchmarks.epoch_speed", "--reps", "5"), ("benchmarks.epoch_speed", "--reps", "1"),
          "Issue 18's goal: device-steps/s of the cache trainer on epoch-reading MNIST work (Pareto sizes, the "
          "paper traces' s) >= 0.85x the same trainer on equal-length work of the same total."),
    Bench("Simulator: the price of Table 3's MNIST grid with E in epochs",
          ("benchmarks.epoch_speed", "--price", "--reps", "3"),
          ("benchmarks.epoch_speed", "--price", "--reps", "1", "--rate-rounds", "1"),
          "Device-steps counted exactly from the engine's own draws (no training), timed on one paired group by "
          "simulator.engine.run_paired: one group, Table 3's MNIST grid and `make paper-table3-mnist-epoch`'s "
          "subset, in core-hours and in days on this machine.",
          section="epoch_price"),
    Bench("Simulator: paired runs (the schemes of a seed) trained together against one by one",
          ("benchmarks.sweep_speed", "--reps", "5"), ("benchmarks.sweep_speed", "--reps", "1",
                                                      "--workloads", "synthetic"),
          "What pairing saves in a sweep (simulator.engine.run_paired)."),
    Bench("Threads per worker process",
          ("benchmarks.threads", "--reps", "3"), ("benchmarks.threads", "--reps", "1", "--workload", "synthetic"),
          "Why every simulation worker runs one torch thread."),
    Bench("The CLI's answer time: --help and an argument error",
          ("benchmarks.cli_speed", "--reps", "9"), ("benchmarks.cli_speed", "--reps", "1"),
          "Issue 18's goal: `--help` and argument errors within 0.5 s of `python -c pass` (the parser imports "
          "neither torch nor data; a unit test checks the imports)."),
    Bench("Edge agent memory beside torch's own",
          ("benchmarks.agent_memory", "--repeat", "3"), ("benchmarks.agent_memory", "--repeat", "1", "--rounds", "2"),
          "Issue 12's Pi budget, and issue 18's after training: idle RSS <= torch + 30 MiB; after 5 trained rounds "
          "of MNIST, RSS <= torch + 30 MiB and peak (VmHWM) <= torch + 80 MiB (as the agent reads them from its "
          "/proc/self/status at the end of its last round and logs them), each over two floors: `import torch` "
          "alone, and torch after training (a bare process that ran 100 SGD steps of the same model with "
          "autograd: the ~10 MiB of libtorch code any training pages in). Both are printed, each against the goal."),
)


def run_bench(bench: Bench, *, quick: bool, out: Path) -> bool:
    """Run one benchmark as its own process and write its section of `out`; False if it failed."""
    argv = bench.quick if quick else bench.args
    command = " ".join(["python -m", *argv])
    print(f"== {command}", flush=True)
    started, machine_then = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), machine()
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", *argv], cwd=REPO, capture_output=True, text=True)
    took = time.perf_counter() - t0
    print(proc.stdout.strip(), flush=True)
    if proc.returncode:
        # Not onto the page: a traceback there once replaced the figures and named this machine's paths.
        print(f"[{bench.name}: exit code {proc.returncode}]\n{proc.stderr.strip()[-4000:]}", file=sys.stderr,
              flush=True)
        return False
    smoke = " With --quick: smoke settings, not figures to quote." if quick else ""
    write_section(out, bench.name, title=bench.title, lines=proc.stdout.strip().splitlines(),
                  intro=f"{bench.what}\n\n`{command}` ({took:.0f} s), {started}; {machine_then}.{smoke}")
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="the page (default results/performance.md; with --quick "
                                             "out/performance-quick.md)")
    ap.add_argument("--quick", action="store_true", help="small settings: check that the benchmarks run")
    ap.add_argument("--only", default="", help="comma-separated benchmark modules or section names to run "
                                                 "(default: all)")
    args = ap.parse_args(argv)
    out = args.out or (QUICK_PAGE if args.quick else PAGE)
    out.parent.mkdir(parents=True, exist_ok=True)
    only = {m.strip() for m in args.only.split(",") if m.strip()}
    chosen = [b for b in BENCHES if not only or b.args[0] in only or b.name in only]
    if not chosen:
        ap.error(f"--only {args.only}: no such benchmark; choose from {', '.join(b.name for b in BENCHES)}")
    failed = [bench.name for bench in chosen if not run_bench(bench, quick=args.quick, out=out)]
    print(f"wrote {out}")
    if failed:
        print(f"benchmarks.performance: {len(failed)} of {len(chosen)} benchmarks failed: {', '.join(failed)} "
              f"(their sections of {out} are left as they were)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
