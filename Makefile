# hypertrace — every target does its own setup, so each works on a fresh clone.
#   make demo    analyzer + simulated 16x8-GPU job over real gRPC, prints the report and writes
#                demo-report.html (the HTML report)
#   make test    installs what the tests need (venv; bcc + kernel headers when root), runs the
#                gates (make lint: ruff; make typecheck: mypy strict on score/ and proto/) and the tests
#   make bench   scoring time per window at 2k/16k/131k GPUs
#   make bench-agent  the agent's coverage and cost on this machine's CPUs (stand-in ranks)
#   make bench-discovery  the agent's /proc scan, every maps read against only what moved
#   make dashboard-png  docs/img/grafana-dashboard.png: the Grafana dashboard from real queries
#   make report-png     docs/img/html-report-*.png: the HTML report at 16 and 2,048 nodes
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
HT     := $(VENV)/bin/hypertrace
STAMP  := $(VENV)/.installed

.PHONY: all venv ebpf-setup test-deps lint typecheck test demo bench bench-report bench-html bench-detect bench-scale bench-agent bench-discovery bench-sched bench-restart bench-cluster bench-storage bench-flood fuzz dashboard-png report-png proto clean

all: venv

venv: $(STAMP)
$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

# bcc comes from the distribution, not PyPI: install it (and kernel headers) when we are root,
# then make it importable from the venv. Not root: the eBPF tests skip (or fail under CI=true).
ebpf-setup: venv
	@if [ "$$(id -u)" = 0 ]; then bash deploy/install-node.sh --venv $(VENV); \
	 else echo "ebpf-setup: not root; eBPF prerequisites not installed (eBPF tests will skip)"; fi

# when root: a real Slurm (slurm-wlm, munge) for the eviction tests, Prometheus, Chromium,
# nats-server, and systemd-nspawn with the Debian root file system the real-systemd deployment
# test boots (.cache/systemd-rootfs, built once: 2-4 minutes)
test-deps:
	@bash tests/install-test-deps.sh

# pyflakes, import order and bugbear over the whole repository (pyproject.toml lists every
# per-file exception, each with its reason)
lint: venv
	$(VENV)/bin/ruff check .

# mypy strict on the pure scoring core and the wire package. The package maps the top-level
# folders into one namespace (hypertrace.*), which mypy cannot follow from the tree: it reads
# them through links under .cache/typecheck/hypertrace
typecheck: venv
	@mkdir -p .cache/typecheck/hypertrace
	@for d in analyzer proto cli daemon collector sim; do ln -sfn ../../../$$d .cache/typecheck/hypertrace/$$d; done
	cd .cache/typecheck && ../../$(VENV)/bin/mypy --config-file ../../pyproject.toml \
	  -p hypertrace.analyzer.score -p hypertrace.proto

test: venv ebpf-setup test-deps lint typecheck
	$(PY) -m pytest -q tests

demo: venv
	$(PY) -m hypertrace.sim.demo

bench: venv
	$(PY) -m hypertrace.sim.bench_scoring

# the report the evictor and the metrics read (brief) and the full one, at 16,384 and 131,072 GPUs,
# with the cluster prediction's values (~3 min)
bench-report: venv
	$(PY) -m hypertrace.sim.bench_report $(ARGS)

# the HTML report at 2,048 and 16,384 GPUs x 60 windows against the canvas page it replaced:
# size (<= 2 MB) and a headless Chromium's time to render (<= 2 s) (~10 min; ARGS="--gpus 2048": ~1 min)
bench-html: venv
	$(PY) -m hypertrace.sim.bench_html $(ARGS)

# scenario catalog x 64..16,384 GPUs, hypertrace vs mean±3σ vs NVRx (~20 min; ARGS=--quick: ~30 s)
bench-detect: venv
	$(PY) -m hypertrace.sim.bench_detect $(ARGS)

# what the agent's scheduler hooks cost each wake-up on the node: a pipe ping-pong with the BPF
# program loaded and without, side by side (root; ~1 min)
bench-sched: venv ebpf-setup
	$(PY) -m hypertrace.sim.bench_sched_hooks $(ARGS)

# an analyzer restarted from its snapshot vs a full replay: the live verdicts, seconds, RSS (~2 min;
# the goal's scale: ARGS="--gpus 16384 --windows 30", ~8 min)
bench-restart: venv
	$(PY) -m hypertrace.sim.bench_restart $(ARGS)

# the cluster mode's CPU per window (a worker in process at 16k GPUs; edge, worker and a real 3-node
# NATS cluster end to end) side by side with one analyzer (~2 min; needs nats-server: make test-deps)
bench-cluster: venv
	$(PY) -m hypertrace.sim.bench_cluster $(ARGS)

# bytes at rest per node-window (vs the schema-3 layout) and a 16,384-GPU job's steady-state disk (~3 min)
bench-storage: venv
	$(PY) -m hypertrace.sim.bench_disk $(ARGS)

# the wire boundary fuzzed: 1e6 inputs into the validator, 20,000 into Ingest.Stream (~10 min)
fuzz: venv
	$(PY) -m hypertrace.sim.fuzz_wire $(ARGS)

# one agent key floods new job ids: the honest report and the job list, quotas on and off (~30 s)
bench-flood: venv
	$(PY) -m hypertrace.sim.bench_flood $(ARGS)

# one analyzer ingesting a 16,384-GPU job over real gRPC, then a ramp (~4-6 min; ARGS=--quick: ~15 s)
bench-scale: venv
	$(PY) -m hypertrace.sim.bench_scale $(ARGS)

# the agent's coverage and cost at the default budget on this machine's CPUs (root): 8 stand-in
# ranks (tests/gpu/standin_loop.py), agents on ranks 0-3, ranks 4-7 the concurrent control (~4 min)
bench-agent: venv ebpf-setup
	$(PY) -c "import sys; sys.path.insert(0, 'tests'); import fakecuda_build; fakecuda_build.build()"
	$(PY) tests/gpu/overhead_concurrent.py --loop tests/gpu/standin_loop.py --shared-cores \
	  --cores 0-$$(($$(nproc) - 1)) --agent-cores 0-$$(($$(nproc) - 1)) --out .bench/agent \
	  --phases 8 --phase-s 30 --settle-s 10 $(ARGS)

# the agent's /proc scan: every process's maps read against only those whose virtual size moved,
# side by side on 8 stand-in ranks with 4 workers each (~10 s)
bench-discovery: venv
	$(PY) -m hypertrace.sim.bench_discovery $(ARGS)

# the Grafana dashboard's panels and queries drawn from a real Prometheus that scraped an
# analyzer during a live simulated 512-GPU job, screenshotted by headless Chromium (~2 min;
# needs prometheus, prometheus-node-exporter and chromium: tests/install-test-deps.sh)
dashboard-png: venv
	$(PY) -m hypertrace.sim.dashboard_preview -o docs/img/grafana-dashboard.png $(ARGS)

# the HTML report's screenshots at 16 and 2,048 nodes for the README, and their structural digest,
# which tests/test_html_report_scale.py compares with the page built now (~4 min; needs chromium)
report-png: venv
	$(PY) -m hypertrace.sim.report_screenshots $(ARGS)

proto: venv
	$(PY) proto/generate.py

clean:
	rm -rf $(VENV) build *.egg-info
