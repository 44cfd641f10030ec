"""Local-training speed of the simulator against a plain sequential PyTorch loop, interleaved.

    python -m benchmarks.sim_speed [--reps 7] [--threads 1] [--workloads mnist,synthetic]

Each workload is one round of local training of every device from one global model:
(a) MNIST, MLP 784-200-200-10, 100 devices (Pareto shards of the real MNIST, non-IID),
batch 10, E = 20; (b) SYNTHETIC(1,1), logistic regression, 50 devices, batch 20, E = 20.
With `--participation full` every device does s = E steps; `traces` draws s from the
paper's trace set (8 traces) as `flexfl sim` does and trains the devices with s > 0.
With `--evaluate` each variant's timed work is a whole round as the engine runs it: training,
the aggregate applied to the global model, and the evaluation on the test set
(simulator.trainers.cache_trainer.evaluate, the engine's, the same call for every variant); the compute-roofline
fraction then counts the evaluation's FLOPs beside the training's (issue 18 states its goals
on whole rounds with the paper traces' participation and evaluation:
`--participation traces --evaluate`).

Variants, timed in the same process, in rotating order within every repetition
(A B C, B C A, ...), all on the same batch plans (edge_agent.trainer.step_plan), each
ending with the round's aggregate sum_k c_k delta_k (c_k = n_k / n over the trained devices):
- cache:      simulator.trainers.cache_trainer.CacheTrainer (one device after another, each in cache,
              numba loops), its deltas written into a buffer kept across rounds, then a
              tensordot with c
- fast:       simulator.trainers.fast_trainer.FastTrainer (all devices together), the same buffer and
              tensordot
- sequential: one nn.Module, global weights copied in, torch.optim.SGD, each delta
              accumulated into the aggregate (the loop a researcher writes by hand)
- torchloop:  one device after another with torch ops and no autograd: the backward pass
              written out, the SGD update fused into the weight-gradient matmul (addmm_),
              buffers reused, each delta accumulated (the best a hand-written torch loop does)
- plain:      edge_agent.trainer.train_local per device (the engine's reference trainer), stacked
It prints device-steps/s per variant (min/median/max over repetitions), the per-repetition
ratios cache/other and fast/other (min/median/max, and each repetition's for cache), each
variant's largest difference from the sequential aggregate (they train the same thing; at
SYNTHETIC's eta = 1 float32 rounding grows over 20 steps: per device, both train_local and
the fast trainer sit ~5e-3 from a float64 run), and, measured in the same repetitions:
- memory bandwidth: `a.add_(b)` on two 256 MiB float32 tensors (3 x 256 MiB moved);
- the MLP step's memory roofline: bandwidth / bytes per device-step, where one SGD step that
  streams its weights moves 4 bytes x (3 x 199,210 parameters: read in the forward pass,
  read and written by the update; + 42,000 for the backward pass reading fc2/fc3 to get
  input gradients) + the batch (10 x 784 x 4 bytes) = 2,589,880 bytes. (Gradients are never
  materialised: the update is fused into the gradient matmul.) The fast trainer keeps a
  chunk of devices' weights in cache through all their steps, so it may pass this line;
- the compute roofline: a single 1024^3 sgemm's FLOP rate / FLOPs per MLP device-step
  (2 x 10 x 199,210 forward, the same for the weight gradients, 2 x 10 x 42,000 for the
  input gradients of fc2 and fc3: 8,808,400), and each variant's fraction of it;
- what the cache trainer skipped: on sparse inputs (MNIST's pixels) its first layer's forward
  and update products take only the inputs not zero in the batch (simulator.trainers.row_kernels), so
  it does fewer FLOPs than the dense count above. The line says which fraction of the first
  layer's inputs its training steps and the evaluation's blocks used, which fraction of the
  round's dense FLOPs that is, and the cache trainer's fraction of the compute roofline
  counted on the FLOPs it did. The goals line judges device-steps/s against the dense count
  (the speed a user gets); the line before it says how much of that is work not done.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from coordinator.rules.aggregation import stack_deltas
from edge_agent.trainer import device_rng, step_plan, train_local
from loadgen.hostinfo import cpu_description
from simulator.trainers.cache_trainer import LAYERS, CacheTrainer, evaluate
from simulator.trainers.fast_trainer import FastTrainer
from workloads.datasets import scaled
from workloads.federated import DEFAULTS, FederatedData, build_federated
from workloads.models import build_model
from workloads.partition_spec import PartitionSpec

MLP_PARAMS = 199_210
MLP_BACKWARD_READ = 200 * 200 + 10 * 200  # fc2 and fc3 weights, read for input gradients
MLP_STEP_BYTES = 4 * (3 * MLP_PARAMS + MLP_BACKWARD_READ) + 4 * 10 * 784
MLP_STEP_FLOPS = 2 * 10 * MLP_PARAMS * 2 + 2 * 10 * MLP_BACKWARD_READ
MLP_EVAL_FLOPS_PER_SAMPLE = 2 * MLP_PARAMS  # one forward pass
MLP_FIRST_LAYER = 784 * 200  # fc1's weights: the products the cache trainer thins out on sparse inputs
BANDWIDTH_FLOATS = 64 * 2**20  # 256 MiB per tensor
VARIANTS = ("cache", "fast", "sequential", "torchloop", "plain")


@dataclass
class Workload:
    name: str
    data: FederatedData
    model: nn.Module
    start: dict[str, torch.Tensor]
    batch_size: int
    E: int
    lr: float
    rows: np.ndarray  # devices trained this round
    steps: np.ndarray  # s per row
    coef: np.ndarray  # aggregation weight per row: n_k / sum of n over the rows


def build_workload(name: str, *, participation: str, seed: int) -> Workload:
    n_devices = {"mnist": 100, "synthetic": 50}[name]
    d = DEFAULTS[name]
    skew = {"alpha": 1.0, "beta": 1.0} if name == "synthetic" else {}
    data = build_federated(PartitionSpec(dataset=name, n_devices=n_devices, iid=False, seed=seed, **skew))
    torch.manual_seed(seed)
    model = build_model(d.model, in_features=d.in_features, num_classes=d.num_classes)
    E = 20
    if participation == "full":
        s = np.full(n_devices, E, dtype=np.int64)
    else:
        from simulator.engine import DEFAULT_TRACE_SET
        from trace_recorder.format import read_trace_set
        from trace_recorder.sampler import TraceSampler, assign_traces

        traces = read_trace_set(DEFAULT_TRACE_SET).first(8)
        assignment = assign_traces(n_devices, n_traces=len(traces), seed=seed)
        s = np.array([TraceSampler(traces[j], E=E, seed=seed, device_index=k).draw(1)
                      for k, j in enumerate(assignment)], dtype=np.int64)
    rows = np.flatnonzero(s > 0)
    n = data.sample_counts[rows]
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    return Workload(name=name, data=data, model=model, start=start,
                    batch_size=d.batch_size, E=E, lr=d.eta0, rows=rows, steps=s[rows], coef=n / n.sum())


def sequential_loop(w: Workload, rngs: list[np.random.Generator]) -> dict[str, torch.Tensor]:
    """The hand-written baseline: one module, copy the global weights in, torch.optim.SGD, accumulate."""
    model = w.model
    params = dict(model.named_parameters())
    aggregate = {n: torch.zeros_like(p) for n, p in params.items()}
    loss_fn = nn.CrossEntropyLoss()
    for k, s, c, rng in zip(w.rows, w.steps, w.coef.tolist(), rngs):
        shard = w.data.train[k]
        x, y = torch.from_numpy(shard.x), torch.from_numpy(shard.y)
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(w.start[n])
        opt = torch.optim.SGD(model.parameters(), lr=w.lr)
        for idx in torch.from_numpy(step_plan(len(shard), batch_size=w.batch_size, steps=int(s), rng=rng)):
            opt.zero_grad()
            loss_fn(model(x[idx]), y[idx]).backward()
            opt.step()
        with torch.no_grad():
            for n, p in params.items():
                aggregate[n].add_(p - w.start[n], alpha=c)
    return aggregate


def torch_loop(w: Workload) -> Callable[[list[np.random.Generator]], dict[str, torch.Tensor]]:
    """One device after another in torch ops without autograd: the backward pass written out, buffers reused."""
    params = dict(w.model.named_parameters())
    names = LAYERS[type(w.model)]
    layers = [(params[wn], params[bn]) for wn, bn in names]
    last = len(layers) - 1
    b = w.batch_size
    widths = [weight.shape[1] for weight, _ in layers] + [layers[-1][0].shape[0]]
    z = [torch.empty(b, n) for n in widths[1:]]  # z[l]: output of layer l
    g_in = [torch.empty(b, n) for n in widths[:-1]]  # g_in[l]: gradient at layer l's input
    target = torch.empty(b, widths[-1])
    x_batch = torch.empty(b, widths[0])
    shards = [(torch.from_numpy(scaled(d.x.reshape(len(d), -1))), torch.from_numpy(d.y)) for d in w.data.train]

    def run(rngs):
        aggregate = {n: torch.zeros_like(p) for n, p in w.start.items()}
        with torch.no_grad():
            for k, s, c, rng in zip(w.rows, w.steps, w.coef.tolist(), rngs):
                x, y = shards[k]
                for (weight, bias), (wn, bn) in zip(layers, names):
                    weight.copy_(w.start[wn])
                    bias.copy_(w.start[bn])
                losses = torch.empty(int(s))
                for t, idx in enumerate(torch.from_numpy(step_plan(len(y), batch_size=b, steps=int(s), rng=rng))):
                    torch.index_select(x, 0, idx, out=x_batch)
                    labels = y.index_select(0, idx).unsqueeze(1)
                    h = x_batch
                    for layer, (weight, bias) in enumerate(layers):
                        h = torch.addmm(bias, h, weight.t(), out=z[layer])
                        if layer < last:
                            h.relu_()
                    logits = h.sub_(h.amax(dim=1, keepdim=True))  # softmax cross-entropy as the trainers do it
                    e = logits.clamp_min(-40.0).exp_()
                    total = e.sum(dim=1, keepdim=True)
                    losses[t] = (total.log().squeeze(1) - logits.gather(1, labels).squeeze(1)).mean()
                    g = e.div_(total).sub_(target.zero_().scatter_(1, labels, 1.0)).mul_(w.lr / b)
                    for layer in range(last, -1, -1):
                        weight, bias = layers[layer]
                        h_in = z[layer - 1] if layer else x_batch
                        if layer:
                            grad_in = torch.mm(g, weight, out=g_in[layer])
                            torch.ops.aten.threshold_backward.grad_input(grad_in, h_in, 0, grad_input=grad_in)
                        weight.addmm_(g.t(), h_in, alpha=-1.0)
                        bias.sub_(g.sum(dim=0))
                        g = grad_in if layer else g
                for (weight, bias), (wn, bn) in zip(layers, names):
                    aggregate[wn].add_(weight - w.start[wn], alpha=c)
                    aggregate[bn].add_(bias - w.start[bn], alpha=c)
        return aggregate

    return run


Aggregator = Callable[[list[np.random.Generator]], dict[str, torch.Tensor]]  # per-row generators -> sum_k c_k delta_k


def variant_fns(w: Workload, variants: list[str], stats: dict[str, float]) -> dict[str, Aggregator]:
    """Each variant trains every row and returns the aggregate sum_k c_k delta_k; the cache variant
    leaves in stats["train_inputs_used"] the fraction of the first layer's inputs its steps used."""
    fast = FastTrainer(w.model, w.data.train, batch_size=w.batch_size)
    coef = torch.from_numpy(w.coef.astype(np.float32))
    # The fast trainer writes into a delta buffer kept from round to round, as an engine would.
    out = {n: torch.empty((len(w.rows), *p.shape)) for n, p in w.start.items()}

    def aggregate(deltas):
        return {n: torch.tensordot(coef, d, dims=1) for n, d in deltas.items()}

    def plain(rngs):
        deltas = []
        for k, s, rng in zip(w.rows, w.steps, rngs):
            with torch.no_grad():
                for n, p in w.model.named_parameters():
                    p.copy_(w.start[n])
            deltas.append(train_local(w.model, w.data.train[k], updates=int(s), lr=w.lr, batch_size=w.batch_size,
                                      rng=rng).delta)
        return aggregate(stack_deltas(deltas))

    def fast_with(trainer):
        return lambda rngs: aggregate(trainer.train(w.start, shard_of_row=w.rows, steps=w.steps, lr=w.lr, rngs=rngs,
                                                    out=out)[0])

    def cache_with(trainer):
        train = fast_with(trainer)

        def run(rngs):
            aggregate = train(rngs)
            stats["train_inputs_used"] = trainer.inputs_used
            return aggregate

        return run

    # fast@N: the fast trainer with N rows per chunk (to choose DEFAULT_CHUNK_ROWS).
    chunked = {v: fast_with(FastTrainer(w.model, w.data.train, batch_size=w.batch_size, chunk_rows=int(v[5:])))
               for v in variants if v.startswith("fast@")}
    return chunked | {
        "cache": cache_with(CacheTrainer(w.model, w.data.train, batch_size=w.batch_size)),
        "fast": fast_with(fast),
        "sequential": lambda rngs: sequential_loop(w, rngs),
        "torchloop": torch_loop(w),
        "plain": plain,
    }


def machine_line() -> str:
    """CPU (with x86 family and model), torch build and threads, CPUs, load average: each trainer benchmark's header."""
    return (f"{cpu_description()}; torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
            f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")


def add_bandwidth_gbs(a: torch.Tensor, b: torch.Tensor) -> float:
    t0 = time.perf_counter()
    a.add_(b)
    return 3 * a.numel() * 4 / (time.perf_counter() - t0) / 1e9


def sgemm_gflops(m: torch.Tensor) -> float:
    t0 = time.perf_counter()
    torch.mm(m, m)
    return 2 * m.shape[0] ** 3 / (time.perf_counter() - t0) / 1e9


def spread(values: list[float], fmt: str = "{:.0f}") -> str:
    low, median, high = (fmt.format(v) for v in (min(values), float(np.median(values)), max(values)))
    return f"min {low}  median {median}  max {high}"


def evaluated(w: Workload, train: Aggregator, stats: dict[str, float]) -> Aggregator:
    """`train`, then the round's close as the engine does it: w_G + aggregate, evaluated on the test set
    (stats["inputs_used"]: the fraction of the first layer's inputs the evaluation used)."""
    def whole_round(rngs):
        aggregate = train(rngs)
        evaluate(w.model, {n: w.start[n] + a for n, a in aggregate.items()}, w.data.test, stats=stats)
        return aggregate

    return whole_round


def run(workload: Workload, *, variants: list[str], reps: int, seed: int, with_evaluation: bool = False) -> None:
    stats: dict[str, float] = {}
    fns = variant_fns(workload, variants, stats)
    if with_evaluation:
        fns = {v: evaluated(workload, fn, stats) for v, fn in fns.items()}
    device_steps = int(workload.steps.sum())
    eval_flops = MLP_EVAL_FLOPS_PER_SAMPLE * len(workload.data.test) if with_evaluation else 0
    roofline = workload.name == "mnist"  # the MLP step's rooflines, measured between the variants
    wall: dict[str, list[float]] = {v: [] for v in variants}  # device-steps per second of wall time
    cpu: dict[str, list[float]] = {v: [] for v in variants}  # ... per second of this thread's CPU time
    bandwidth, gflops = [], []
    if roofline:
        a, b = torch.ones(BANDWIDTH_FLOATS), torch.ones(BANDWIDTH_FLOATS)
        m = torch.randn(1024, 1024)
    print(f"\n== {workload.name}: {len(workload.rows)} devices training, batch {workload.batch_size}, E {workload.E}, "
          f"{device_steps} device-steps per round (mean s {workload.steps.mean():.1f})"
          + (f"; each round evaluated on {len(workload.data.test)} test samples" if with_evaluation else ""))
    for rep in range(-1, reps):  # rep -1 warms up (allocations, MKL, batch plans) and checks equality
        order = variants[rep % len(variants):] + variants[: rep % len(variants)]
        out = {}
        for v in order:
            rngs = [device_rng(seed, rep + 2, int(k)) for k in workload.rows]
            t0, c0 = time.perf_counter(), time.thread_time()
            out[v] = fns[v](rngs)
            if rep >= 0:
                wall[v].append(device_steps / (time.perf_counter() - t0))
                cpu[v].append(device_steps / (time.thread_time() - c0))
        if roofline and rep >= 0:
            bandwidth.append(add_bandwidth_gbs(a, b))
            gflops.append(sgemm_gflops(m))
        if rep == -1 and "sequential" in out:  # all variants train the same thing (up to float32 rounding)
            ref = out["sequential"]
            diffs = ", ".join(f"{v} {max(float((out[v][n] - ref[n]).abs().max()) for n in ref):.1e}" for v in variants
                              if v != "sequential")
            print(f"aggregate update: max |variant - sequential|: {diffs} (max |sequential| "
                  f"{max(float(t.abs().max()) for t in ref.values()):.1e})")
    for v in variants:
        print(f"{v:>10}: device-steps/s  {spread(wall[v])}   (per CPU-second: {spread(cpu[v])})")
    for lead in [v for v in ("cache", "fast") if v in variants]:
        for v in variants:
            if v != lead and not (lead == "fast" and v == "cache"):
                ratios = [f / o for f, o in zip(wall[lead], wall[v])]
                each = f"   [each: {' '.join(f'{r:.2f}' for r in ratios)}]" if lead == "cache" else ""
                print(f"  {lead}/{v}: {spread(ratios, '{:.2f}x')}   "
                      f"(CPU time: {spread([f / o for f, o in zip(cpu[lead], cpu[v])], '{:.2f}x')}){each}")
    if roofline:
        roof = [bw * 1e9 / MLP_STEP_BYTES for bw in bandwidth]
        # Device-steps per second at the compute limit: a round's FLOPs (training and any evaluation) over
        # the sgemm rate, expressed in the round's device-steps.
        round_flops = device_steps * MLP_STEP_FLOPS + eval_flops
        comp = [g * 1e9 / round_flops * device_steps for g in gflops]
        threads = torch.get_num_threads()
        print(f"memory bandwidth (add_, 2 x 256 MiB, {threads} thread(s)): {spread(bandwidth, '{:.1f} GB/s')}")
        print(f"memory roofline at {MLP_STEP_BYTES:,} bytes per MLP device-step: device-steps/s {spread(roof)}")
        print(f"sgemm 1024^3: {spread(gflops, '{:.1f} GFLOP/s')}")
        with_eval = f" + {eval_flops:,} per round for the evaluation" if eval_flops else ""
        print(f"compute roofline at {MLP_STEP_FLOPS:,} FLOPs per MLP device-step{with_eval}: "
              f"device-steps/s {spread(comp)}")
        for v in variants:
            print(f"  {v} / memory roofline: {spread([f / r for f, r in zip(wall[v], roof)], '{:.2f}')}   "
                  f"/ compute roofline: {spread([f / r for f, r in zip(wall[v], comp)], '{:.2f}')}")
        if "train_inputs_used" in stats:  # the cache trainer skips inputs zero in a whole batch
            used = stats["train_inputs_used"]
            eval_used = stats.get("inputs_used", 1.0)
            skipped = 2 * 10 * MLP_FIRST_LAYER * 2 * (1 - used)  # per device-step: forward and update
            eval_skipped = eval_flops / MLP_PARAMS * MLP_FIRST_LAYER * (1 - eval_used)
            done = device_steps * (MLP_STEP_FLOPS - skipped) + eval_flops - eval_skipped
            done_comp = [g * 1e9 / done * device_steps for g in gflops]
            dense = device_steps * MLP_STEP_FLOPS + eval_flops
            print(f"cache: the first layer's inputs used {used:.1%} per training step"
                  + (f", {eval_used:.1%} per evaluation block" if with_evaluation else "")
                  + f" (the rest are zero in the whole batch and skipped): {done / dense:.1%}"
                  f" of the round's dense FLOPs done; on the FLOPs done, cache / compute roofline: "
                  f"{spread([f / r for f, r in zip(wall['cache'], done_comp)], '{:.2f}')}")
        if {"cache", "sequential", "torchloop"} <= set(variants):
            print(goals_line(wall, comp))


def goals_line(wall: dict[str, list[float]], comp: list[float]) -> str:
    """Issue 18's three goals for the cache trainer, judged on medians over the repetitions (MNIST)."""
    fraction = float(np.median([f / r for f, r in zip(wall["cache"], comp)]))
    over_seq = float(np.median([c / o for c, o in zip(wall["cache"], wall["sequential"])]))
    over_loop = float(np.median([c / o for c, o in zip(wall["cache"], wall["torchloop"])]))
    verdict = {True: "met", False: "NOT met"}
    return (f"goals (cache, medians): compute roofline {fraction:.2f} (>= 0.65: {verdict[fraction >= 0.65]}); "
            f"cache/sequential {over_seq:.2f}x (>= 3x: {verdict[over_seq >= 3]}); "
            f"cache/torchloop {over_loop:.2f}x (> 1: {verdict[over_loop > 1]})")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.sim_speed", description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=7, help="timed repetitions per variant (default 7)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: one per worker process)")
    p.add_argument("--workloads", default="mnist,synthetic", help="comma-separated: mnist, synthetic")
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help=f"comma-separated, from {','.join(VARIANTS)} and fast@N "
                        "(the fast trainer with N rows per chunk)")
    p.add_argument("--participation", choices=["full", "traces"], default="full")
    p.add_argument("--evaluate", action="store_true",
                   help="time whole rounds: the aggregate applied and evaluated on the test set, as the engine does")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(v for v in set(variants) - set(VARIANTS)
                     if not (v.startswith("fast@") and v[5:].isdigit() and int(v[5:]) > 0))
    if unknown:
        p.error(f"unknown variants {unknown}; choose from {list(VARIANTS)} or fast@N (N rows per chunk)")
    torch.set_num_threads(args.threads)
    print(f"{machine_line()}, participation {args.participation}, "
          f"{'whole rounds with evaluation' if args.evaluate else 'training only'}, {args.reps} reps")
    for name in [n for n in args.workloads.split(",") if n]:
        if name not in ("mnist", "synthetic"):
            p.error(f"unknown workload {name!r}; choose mnist or synthetic")
        w = build_workload(name, participation=args.participation, seed=args.seed)
        run(w, variants=variants, reps=args.reps, seed=args.seed, with_evaluation=args.evaluate)


if __name__ == "__main__":
    main()
