"""Fuzz the coordinator's gRPC surface and the config parsers; then check a legitimate round.

    python -m benchmarks.fuzz                       # full run: 10,000 calls, 1,000 documents per parser
    python -m benchmarks.fuzz --messages 300 --configs 100 --seed 1

Steps (see benchmarks/fuzz_grpc.py and fuzz_config.py for what is generated):
1. every config parser gets `--configs` documents: a config or a ConfigError, nothing else;
2. a `flexfl coordinator` process opens round 1 for honest-a, honest-b and evil; after a
   warm-up of 200 calls its resident memory is the baseline; `--messages` generated calls
   follow, with Status checked and memory sampled every 250;
3. honest-a (s = 3), honest-b (s = E) and evil (s = 0) send valid updates; the round closes
   and the coordinator's checkpointed model must equal w0 + sum_k c_k delta_k computed
   here from those three updates alone (Scheme C coefficients by hand in float64, and the
   shared round replayed bit for bit), and the resident memory must have grown by less
   than `--rss-bound-mib` over the fuzzing.
Prints calls tried by kind and status code, and memory before/after; exit 1 on a failure.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import psutil
import torch
from flexfl.proto import fleet_pb2 as pb
from flexfl.proto import tensors as wire

from benchmarks.fuzz_config import fuzz_configs
from benchmarks.fuzz_grpc import EVIL, HONEST, SAMPLES, Client, Target, fuzz_grpc
from coordinator.checkpoint import load_checkpoint
from coordinator.config import CoordinatorConfig, OutputConfig, RunConfig, ServerConfig
from coordinator.metrics import read_metrics
from coordinator.rules.config import RulesConfig
from coordinator.rules.round import Arrival, Federation
from flexfl.config import write_config
from flexfl.files import atomic_file
from loadgen.harness import Harness, free_port
from workloads.federated import initial_model
from workloads.partition_spec import PartitionSpec

TOKEN = "fuzz-fleet-token"
WARMUP_CALLS = 200
E = 5


class FuzzFailure(AssertionError):
    pass


def _coordinator_config(tmp: Path) -> tuple[Path, str, CoordinatorConfig]:
    with atomic_file(tmp / "token", perms=0o600) as f:
        f.write(TOKEN)
    address = f"127.0.0.1:{free_port()}"
    cfg = CoordinatorConfig(
        # A short pull wait: fuzzed pulls from devices that have nothing to train return fast.
        server=ServerConfig(listen=address, fleet_token_file=str(tmp / "token"), pull_wait_s=0.02, max_update_mib=1.0),
        partition=PartitionSpec(n_devices=4, total_samples=400), rules=RulesConfig(required_updates=E),
        # One round, open for as long as the fuzzing takes.
        run=RunConfig(rounds=1, deadline_s=7200.0, min_devices=3), output=OutputConfig(dir=str(tmp / "out")))
    return write_config(tmp / "coordinator.toml", cfg, header="benchmarks.fuzz"), address, cfg


def _rss_mib(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


def _wait(predicate, what: str, timeout_s: float = 60.0) -> None:
    limit = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > limit:
            raise FuzzFailure(f"timed out waiting for {what}")
        time.sleep(0.05)


def expected_model(cfg: CoordinatorConfig, updates: dict[str, tuple[int, dict[str, np.ndarray]]]):
    """The round's model from the valid updates alone: (by hand in float64, by the shared round)."""
    _, w0 = initial_model(cfg.partition.dataset, seed=cfg.run.seed)
    members = [*HONEST, EVIL]  # join order
    n = np.array([SAMPLES[d] for d in members], dtype=np.float64)
    p = n / n.sum()
    s = np.array([updates[d][0] for d in members])
    # Scheme C: c_k = p_k E / s_k for s_k > 0, else 0 (paper eq. for unbiased incomplete work).
    c = np.where(s > 0, p * E / np.maximum(s, 1), 0.0)
    by_hand = {name: w0[name].double() + sum(c[i] * torch.from_numpy(updates[d][1][name]).double()
                                             for i, d in enumerate(members) if s[i] > 0) for name in w0}
    fed = Federation(rules=cfg.rules, dataset=cfg.partition.dataset, params={k: v.clone() for k, v in w0.items()})
    fed.apply_events(arrivals=[Arrival(d, SAMPLES[d]) for d in members])
    # The coordinator sums updates as they arrive: the same, in the order they were pushed.
    summed = fed.start_sum(fed.open(1))
    for d, (s_d, delta) in updates.items():
        if s_d > 0:
            summed.add(d, s=s_d, delta=delta)
    return by_hand, fed.close_summed(fed.weigh(1, summed.s), summed=summed).params


def run(messages: int, configs: int, *, random_seed: int = 0, rss_bound_mib: float = 64.0,
        keep: Path | None = None, only: tuple[str, ...] = (), log=print) -> dict:
    """The whole fuzz run; returns the figures, raises FuzzFailure (or hypothesis's error) on a failure."""
    started = time.monotonic()
    summary: dict = {"seed": random_seed}
    if configs:
        t0 = time.monotonic()
        tally = fuzz_configs(configs, random_seed=random_seed)
        summary["config_documents"] = sum(tally.values())
        summary["config_outcomes"] = {f"{k[0]}: {k[1]}": v for k, v in sorted(tally.items())}
        log(f"config parsers: {summary['config_documents']} documents in {time.monotonic() - t0:.0f} s, "
            "every one a config or a ConfigError")
    if not messages:
        return summary
    with tempfile.TemporaryDirectory(prefix="flexfl-fuzz-") as d:
        tmp = Path(keep or d)
        tmp.mkdir(parents=True, exist_ok=True)
        config, address, cfg = _coordinator_config(tmp)
        with Harness(tmp) as harness:
            coordinator = harness.start_coordinator(config, address=address, token=TOKEN)
            harness.wait_ready()
            pid = coordinator.proc.pid
            client = Client(address, TOKEN)
            try:
                for device in (*HONEST, EVIL):
                    client.join(device, SAMPLES[device])
                _wait(lambda: (harness.status().open_round or 0) == 1, "round 1 to open")
                pulled = {device: client.pull(device) for device in (*HONEST, EVIL)}
                header, model = pulled[EVIL]
                target = Target(client=client, round_id=header.round_id, E=header.required_updates, model=model)
                rss = {"start": _rss_mib(pid)}
                fuzz_grpc(target, WARMUP_CALLS, random_seed=random_seed + 1, only=only)
                rss["after_warmup"] = _rss_mib(pid)
                samples: list[tuple[int, float]] = []
                threads: list[int] = []

                def check(done: int) -> None:
                    st = harness.status()
                    if st is None or st.open_round != 1 or st.finished:
                        raise FuzzFailure(f"after {done} calls the coordinator's state is {st}")
                    samples.append((done, _rss_mib(pid)))
                    threads.append(psutil.Process(pid).num_threads())

                target.tally.clear()
                t0 = time.monotonic()
                tally = fuzz_grpc(target, messages, random_seed=random_seed, on_check=check, only=only)
                fuzz_s = time.monotonic() - t0
                check(messages)
                rss["after_fuzz"] = _rss_mib(pid)
                # The legitimate end of the round.
                rng = np.random.default_rng(random_seed)
                updates = {
                    HONEST[0]: (3, {n: (rng.standard_normal(v.shape) * 0.05).astype(np.float32)
                                    for n, v in model.items()}),
                    HONEST[1]: (E, {n: (rng.standard_normal(v.shape) * 0.05).astype(np.float32)
                                    for n, v in model.items()}),
                    EVIL: (0, {}),
                }
                for device, (s, delta) in updates.items():
                    payload, data = wire.encode(delta) if delta else (pb.Payload(), b"")
                    reply = client.push(device, pb.UpdateHeader(device_id=device, round_id=1, updates_completed=s,
                                                                samples_used=10, payload=payload), data)
                    if not reply.accepted:
                        raise FuzzFailure(f"the valid update of {device} was refused: {reply.message}")
            finally:
                client.close()
            code = coordinator.proc.wait(timeout=120)
            if code != 0:
                raise FuzzFailure(f"the coordinator exited with {code}; see {coordinator.log_path}")
            out = Path(cfg.output.dir)
            ckpt = load_checkpoint(out / "checkpoint.pt", expected={n: (v.shape, None) for n, v in model.items()})
            row = read_metrics(out / "metrics.jsonl")[-1]
        by_hand, replayed = expected_model(cfg, updates)
        for name, value in ckpt.params.items():
            if not torch.equal(value, replayed[name]):
                raise FuzzFailure(f"tensor {name}: the coordinator's model differs from the shared round's replay")
            err = float((value.double() - by_hand[name]).abs().max())
            if err > 1e-6:
                raise FuzzFailure(f"tensor {name}: off the hand-computed model by {err:g}")
        pushed = any(kind == "PushUpdate" for kind, _ in tally)
        rejected = row.live.rejected if row.live is not None else {}
        if row.s != {HONEST[0]: 3, HONEST[1]: E, EVIL: 0} or (pushed and not rejected.get(EVIL)):
            raise FuzzFailure(f"round 1's row: s {dict(row.s)}, rejected {list(rejected)}")
    grown = rss["after_fuzz"] - rss["after_warmup"]
    xs = np.array([x for x, _ in samples], dtype=float)
    ys = np.array([y for _, y in samples])
    slope = float(np.polyfit(xs, ys, 1)[0] * 1000) if len(samples) >= 3 else float("nan")
    by_kind, by_code = Counter(), Counter()
    for (kind, code), v in tally.items():
        by_kind[kind] += v
        by_code[code] += v
    summary.update({
        "calls": sum(tally.values()), "calls_per_s": sum(tally.values()) / fuzz_s, "by_kind": dict(by_kind),
        "by_code": dict(by_code), "by_kind_and_code": {f"{k} -> {c}": v for (k, c), v in sorted(tally.items())},
        "rss_mib": rss, "rss_grown_mib": grown, "rss_bound_mib": rss_bound_mib, "rss_slope_mib_per_1000_calls": slope,
        "model": "equal to the valid updates' aggregate", "wall_s": time.monotonic() - started,
        "rejections_recorded_for_evil": len(rejected.get(EVIL, ())),
        "rss_samples_calls_mib": [(x, round(y, 1)) for x, y in samples], "coordinator_threads": threads,
    })
    log(f"gRPC: {summary['calls']} calls in {fuzz_s:.0f} s ({summary['calls_per_s']:.0f}/s) after {WARMUP_CALLS} "
        "warm-up calls")
    log("  by kind:   " + ", ".join(f"{k} {v}" for k, v in sorted(by_kind.items())))
    log("  by status: " + ", ".join(f"{k} {v}" for k, v in sorted(by_code.items(), key=lambda kv: -kv[1])))
    log(f"  coordinator RSS: {rss['start']:.1f} MiB at start, {rss['after_warmup']:.1f} after warm-up, "
        f"{rss['after_fuzz']:.1f} after fuzzing (+{grown:.1f} MiB, bound {rss_bound_mib:g}; "
        f"slope {slope:+.2f} MiB per 1000 calls over {len(samples)} samples)")
    log("  legitimate round after fuzzing: closed, model equal to w0 + sum c_k delta_k of the valid updates alone")
    if grown > rss_bound_mib:
        raise FuzzFailure(f"coordinator RSS grew by {grown:.1f} MiB over the fuzzing (bound {rss_bound_mib:g})")
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fuzz", description=__doc__.split("\n")[0])
    p.add_argument("--messages", type=int, default=10_000, help="generated gRPC calls (default 10000)")
    p.add_argument("--configs", type=int, default=1000, help="documents per config parser (default 1000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rss-bound-mib", type=float, default=64.0, help="allowed coordinator RSS growth (default 64)")
    p.add_argument("--json", type=Path, help="also write the figures here")
    p.add_argument("--keep", type=Path, help="work in this folder and keep it (coordinator log, metrics)")
    p.add_argument("--only", default="", help="comma list of call kinds (push, join, leave, pull, status, raw, tcp)")
    args = p.parse_args(argv)
    try:
        summary = run(args.messages, args.configs, random_seed=args.seed, rss_bound_mib=args.rss_bound_mib,
                      keep=args.keep, only=tuple(k for k in args.only.split(",") if k))
    except FuzzFailure as exc:
        print(f"fuzz: FAILED: {exc}", file=sys.stderr)
        return 1
    if args.json:
        with atomic_file(args.json) as f:
            json.dump(summary, f, indent=1)
    print(f"fuzz: passed ({summary.get('calls', 0)} gRPC calls, {summary.get('config_documents', 0)} config "
          f"documents, seed {args.seed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
