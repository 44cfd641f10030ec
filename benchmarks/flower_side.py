"""Flower's side of benchmarks/flower_compare.py; runs in the Flower virtualenv (.venv-flower), not FlexFL's.

    python benchmarks/flower_side.py server --address 127.0.0.1:PORT --agents 20 --rounds 12 [--eval] --out times.json
    python benchmarks/flower_side.py clients --address 127.0.0.1:PORT --agents 20

Flower's legacy gRPC API (flwr.server.start_server with a FedAvg strategy; clients through
flwr.client.start_client, as threads of one process): the fastest way Flower 1.x runs a
round. Clients are no-ops that return the parameters they received. The model is FlexFL's
MNIST MLP (199,210 float32) with FlexFL's initial weights; with --eval the strategy's
evaluate_fn tests every new global model on the same 10k MNIST test images with FlexFL's
own evaluate(). The server writes when each round's fit began (configure_fit), so that
round periods are measured the way FlexFL's are: one round's opening to the next's.

FlexFL (grpcio, protobuf >= 7) and Flower 1.41 (protobuf < 7) cannot share a virtualenv;
this script imports only FlexFL's `workloads` package, which needs neither.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import numpy as np


def _model_and_test(n_devices: int):
    from workloads.federated import build_federated, initial_model
    from workloads.partition_spec import Dataset, PartitionSpec, Sizes

    # The same partition spec as the FlexFL coordinator of benchmarks/coordinator_bench.py: same test set.
    spec = PartitionSpec(dataset=Dataset.MNIST, n_devices=max(n_devices, 2), sizes=Sizes.EQUAL)
    model, params = initial_model(spec.dataset, seed=0)
    return model, params, build_federated(spec).test


def server(args: argparse.Namespace) -> None:
    import flwr as fl
    import torch
    from flwr.common import ndarrays_to_parameters

    from workloads.evaluation import evaluate

    model, params, test = _model_and_test(args.agents)
    names = list(params)
    fit_started: list[float] = []

    def evaluate_fn(server_round: int, ndarrays: list[np.ndarray], config: dict):
        weights = {n: torch.from_numpy(np.asarray(a)) for n, a in zip(names, ndarrays)}
        acc, loss = evaluate(model, weights, test)
        return loss, {"accuracy": acc}

    class TimedFedAvg(fl.server.strategy.FedAvg):
        def configure_fit(self, server_round, parameters, client_manager):
            fit_started.append(time.monotonic())
            return super().configure_fit(server_round, parameters, client_manager)

    strategy = TimedFedAvg(
        fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=args.agents, min_evaluate_clients=0,
        min_available_clients=args.agents, evaluate_fn=evaluate_fn if args.eval else None,
        initial_parameters=ndarrays_to_parameters([p.detach().numpy() for p in params.values()]))
    fl.server.start_server(server_address=args.address, config=fl.server.ServerConfig(num_rounds=args.rounds),
                           strategy=strategy)
    Path(args.out).write_text(json.dumps({"fit_started": fit_started, "flwr": fl.__version__}))


def clients(args: argparse.Namespace) -> None:
    import flwr as fl
    import grpc

    if not args.shared_connection:
        # Flower opens a channel per client, but gRPC's global subchannel pool lets channels with
        # the same target and options share one TCP connection. Separate devices have their own:
        # a local pool per channel gives each client its own connection, as FlexFL's bench agents have.
        plain = grpc.insecure_channel

        def own_connection(target, options=None, compression=None):
            return plain(target, options=[*(options or []), ("grpc.use_local_subchannel_pool", 1)],
                         compression=compression)

        grpc.insecure_channel = own_connection

    class NoOp(fl.client.NumPyClient):
        def get_parameters(self, config):
            return []

        def fit(self, parameters, config):
            return parameters, 1, {}

    threads = [threading.Thread(target=fl.client.start_client,
                                kwargs=dict(server_address=args.address, client=NoOp().to_client()), daemon=True)
               for _ in range(args.agents)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("role", choices=["server", "clients"])
    ap.add_argument("--address", required=True)
    ap.add_argument("--agents", type=int, required=True)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--eval", action="store_true", help="central evaluation of every round's model (evaluate_fn)")
    ap.add_argument("--out", default="flower-times.json")
    ap.add_argument("--shared-connection", action="store_true",
                    help="clients: let gRPC put all clients on one TCP connection (its default)")
    args = ap.parse_args()
    server(args) if args.role == "server" else clients(args)


if __name__ == "__main__":
    main()
