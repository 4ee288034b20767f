# hypertrace — every target does its own setup, so each works on a fresh clone.
#   make demo    analyzer + simulated 16x8-GPU job over real gRPC, prints the report
#   make test    installs what the tests need (venv; bcc + kernel headers when root) and runs them
#   make bench   scoring time per window at 2k/16k/131k GPUs
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
HT     := $(VENV)/bin/hypertrace
STAMP  := $(VENV)/.installed

.PHONY: all venv ebpf-setup test demo bench bench-detect bench-scale proto clean

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

test: venv ebpf-setup
	$(PY) -m pytest -q tests

demo: venv
	$(PY) -m hypertrace.analyzer.demo

bench: venv
	$(PY) -m hypertrace.analyzer.bench_scoring

# scenario catalog x 64..16,384 GPUs, hypertrace vs mean±3σ vs NVRx (~20 min; ARGS=--quick: ~30 s)
bench-detect: venv
	$(PY) -m hypertrace.analyzer.bench_detect $(ARGS)

# one analyzer ingesting a 16,384-GPU job over real gRPC, then a ramp (~4-6 min; ARGS=--quick: ~15 s)
bench-scale: venv
	$(PY) -m hypertrace.analyzer.bench_scale $(ARGS)

proto: venv
	$(PY) proto/generate.py

clean:
	rm -rf $(VENV) build *.egg-info
