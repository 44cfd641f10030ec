"""Run the simulator and agent benchmarks; keep each one's output verbatim in results/performance.md.

    python -m benchmarks.performance [--out results/performance.md] [--quick] [--only MODULES]

Each benchmark is a script of this folder that interleaves the variants it compares and
prints its own figures and ratios (min / median / max); this only runs them one after the
other, as separate processes, and writes what each printed as its own section of the page
(benchmarks/report.py), beside the command and the machine. Other sections (the
coordinator's, `make bench-coordinator`) and the prose are left as they are. --quick passes
each benchmark's own small settings (a smoke run, not figures to quote).
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
          ("benchmarks.threads", "--reps", "3"), ("benchmarks.threads", "--reps", "1"),
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "results" / "performance.md")
    ap.add_argument("--quick", action="store_true", help="small settings: check that the benchmarks run")
    ap.add_argument("--only", default="", help="comma-separated benchmark modules or section names to run "
                                                 "(default: all)")
    args = ap.parse_args()
    only = {m.strip() for m in args.only.split(",") if m.strip()}
    for bench in BENCHES:
        argv = bench.quick if args.quick else bench.args
        if only and argv[0] not in only and bench.name not in only:
            continue
        command = " ".join(["python -m", *argv])
        print(f"== {command}", flush=True)
        started, machine_then = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), machine()
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", *argv], cwd=REPO, capture_output=True, text=True)
        took = time.perf_counter() - t0
        output = proc.stdout.strip() + (f"\n[exit code {proc.returncode}]\n{proc.stderr.strip()[-2000:]}"
                                        if proc.returncode else "")
        print(output, flush=True)
        smoke = " With --quick: smoke settings, not figures to quote." if args.quick else ""
        write_section(args.out, bench.name, title=bench.title, lines=output.splitlines(),
                      intro=f"{bench.what}\n\n`{command}` ({took:.0f} s), {started}; {machine_then}.{smoke}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
