# Two entry points, each doing its own set-up on a fresh machine:
#   make bench   build qkern in .venv and run the benchmark
#   make test    build, build the docs (warnings are errors), run the test
#                suite once per ISA level this CPU runs, check qkern without
#                PyTorch, then run the whole suite with the doctests
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BENCH_ARGS ?= --quick
DEPS := "setuptools>=64" wheel "Cython>=3.0" "numpy>=2.0" "ml_dtypes>=0.4" \
        "pytest>=8" "hypothesis>=6" "threadpoolctl>=3" "sphinx>=7" "numpydoc>=1.6"
TORCH := torch==2.13.0

.PHONY: build test bench docs clean

$(VENV)/.deps: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(DEPS)
	$(PY) -m pip install -q $(TORCH) || echo "note: $(TORCH) not installable here; the torch parity tests will be skipped"
	touch $@

build: $(VENV)/.deps
	$(PY) -m pip install -q --no-build-isolation -e .

docs: build
	$(PY) -m sphinx -W --keep-going -q -b html docs docs/_build/html

test: docs
	@set -e; for isa in $$($(PY) -c "from qkern import dispatch as d; print(*d.ISA_LEVELS[:d.ISA_LEVELS.index(d.CPU_ISA) + 1])"); do \
	  echo "=== QKERN_ISA=$$isa"; \
	  QKERN_ISA=$$isa $(PY) -m pytest -q -p no:cacheprovider tests; \
	done
	@echo "=== qkern with PyTorch blocked, as if not installed"
	$(PY) tests/no_torch.py
	@echo "=== whole suite, no ISA cap, with doctests"
	$(PY) -m pytest -p no:cacheprovider --doctest-modules qkern tests

bench: build
	$(PY) -m qkern bench $(BENCH_ARGS)

clean:
	rm -rf build docs/_build qkern/*.so qkern/_*.c *.egg-info
