# Two entry points, each doing its own set-up on a fresh machine:
#   make bench   build qkern in .venv and run the benchmark
#   make test    build, build the docs (warnings are errors), run the test
#                suite once per ISA level this CPU runs, check qkern without
#                PyTorch, then run the whole suite with the doctests (GPU-marked
#                tests skip, with the reason, on machines without one)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BENCH_ARGS ?= --quick
DEPS := "setuptools>=64" wheel "Cython>=3.0" "numpy>=2.0" "ml_dtypes>=0.4" \
        "pytest>=8" "hypothesis>=6" "threadpoolctl>=3" "sphinx>=7" "numpydoc>=1.6"
TORCH := torch==2.13.0
# What the no-GPU cuDNN tests need: the cuDNN library itself (its graph API,
# not cuBLAS: --no-deps skips the 400 MB nvidia-cublas it declares) and
# cuda.core for the interop checks.  ~600 MB download, ~900 MB installed,
# 15-30 s with pip's cache (docs/qconv2d.rst, "CI").
CUDA_TEST_DEPS := "cuda-core>=0.4" "cuda-bindings>=13" "cuda-pathfinder>=1.2"

.PHONY: build test bench docs clean

$(VENV)/.deps: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(DEPS)
	$(PY) -m pip install -q $(TORCH) || echo "note: $(TORCH) not installable here; the torch parity tests will be skipped"
	$(PY) -m pip install -q --no-deps "nvidia-cudnn-cu13>=9.10"
	$(PY) -m pip install -q $(CUDA_TEST_DEPS)
	touch $@

build: $(VENV)/.deps
	$(PY) -m pip install -q --no-build-isolation -e .

docs: build
	$(PY) -m sphinx -W --keep-going -q -b html docs docs/_build/html

# QKERN_REQUIRE_CUDNN=1: the descriptor-finalization tests fail, not skip,
# when the cuDNN wheel is missing.
test: export QKERN_REQUIRE_CUDNN = 1
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
	rm -rf build docs/_build qkern/*.so qkern/cudnn/*.so qkern/_*.c qkern/cudnn/*.c *.egg-info
