# Two entry points, each doing its own set-up on a fresh machine:
#   make bench   build qkern in .venv and run the benchmark
#   make test    build, build the docs (warnings are errors), run the
#                reliability checks below (valgrind and fuzz side by side),
#                then the test suite capped at each ISA level below this
#                CPU's, check qkern without PyTorch, then the whole suite
#                uncapped with the doctests (GPU-marked tests skip, with
#                the reason, on machines without one)
# The reliability checks (docs/reliability.rst), also runnable alone:
#   make sanitize   the test suite under ASan + UBSan (ref, and the highest ISA)
#   make valgrind   memcheck over the kernel tester and API tests (AVX2 cap)
#   make fuzz       every fuzz target for FUZZ_SECONDS under atheris
#   make lint       ruff (pyproject.toml) and clang-format (.clang-format)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BENCH_ARGS ?= --quick
FUZZ_SECONDS ?= 60
DEPS := "setuptools>=64" wheel "Cython>=3.0" "numpy>=2.0" "ml_dtypes>=0.4" \
        "pytest>=8" "hypothesis>=6" "threadpoolctl>=3" "simde-py>=0.8.2" "sphinx>=7" "numpydoc>=1.6" \
        ruff==0.17.6 clang-format==18.1.8
TORCH := torch==2.13.0
# What the no-GPU cuDNN tests need: the cuDNN library itself (its graph API,
# not cuBLAS: --no-deps skips the 400 MB nvidia-cublas it declares) and
# cuda.core for the interop checks.  ~600 MB download, ~900 MB installed,
# 15-30 s with pip's cache (docs/qconv2d.rst, "CI").
CUDA_TEST_DEPS := "cuda-core>=0.4" "cuda-bindings>=13" "cuda-pathfinder>=1.2"
ATHERIS := "atheris>=2.3"
# The benchmark's runtime peers (pyproject.toml's bench extra), ~280 MB installed.
BENCH_PEERS := "openvino>=2026.4" "onnxruntime>=1.31" "onnx>=1.23"
PYTEST := -m pytest -q -p no:cacheprovider
# ISA levels below this CPU's, lowest first (needs the build); the CPU's own
# level is the uncapped pass
CAPPED_ISAS = $$($(PY) -c "from qkern import dispatch as d; print(*d.ISA_LEVELS[:d.ISA_LEVELS.index(d.CPU_ISA)])")

.PHONY: build test bench docs clean sanitize valgrind fuzz lint

$(VENV)/.deps: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(DEPS)
	$(PY) -m pip install -q $(TORCH) || echo "note: $(TORCH) not installable here; the torch parity tests will be skipped"
	$(PY) -m pip install -q --no-deps "nvidia-cudnn-cu13>=9.10"
	$(PY) -m pip install -q $(CUDA_TEST_DEPS)
	$(PY) -m pip install -q $(ATHERIS) || echo "note: $(ATHERIS) not installable here; make fuzz will fail"
	$(PY) -m pip install -q $(BENCH_PEERS) || echo "note: OpenVINO / ONNX Runtime not installable here; the bench leaves them out"
	touch $@

build: $(VENV)/.deps
	$(PY) -m pip install -q --no-build-isolation -e .

docs: build
	$(PY) -m sphinx -W --keep-going -q -b html docs docs/_build/html

# The linters are pinned: a new release may format or warn differently.
lint: $(VENV)/.deps
	$(VENV)/bin/ruff check --no-cache .
	$(VENV)/bin/clang-format --dry-run -Werror $$(find src include tests -name '*.[ch]' | sort)
	@echo "lint: ruff and clang-format clean"

# QKERN_REQUIRE_CUDNN=1: the descriptor-finalization tests fail, not skip,
# when the cuDNN wheel is missing.
test: export QKERN_REQUIRE_CUDNN = 1
# valgrind runs on one core and fuzz for a fixed time: they share the two
# (-o build: both need the build that sanitize's prerequisite made).
test: lint docs sanitize
	$(MAKE) -j2 --output-sync=target -o build valgrind fuzz
	@set -e; for isa in $(CAPPED_ISAS); do \
	  echo "=== QKERN_ISA=$$isa"; \
	  QKERN_ISA=$$isa $(PY) $(PYTEST) tests; \
	done
	@echo "=== qkern with PyTorch blocked, as if not installed"
	$(PY) tests/no_torch.py
	@echo "=== whole suite, no ISA cap, with doctests"
	$(PY) -m pytest -p no:cacheprovider --doctest-modules qkern tests

bench: build
	$(PY) benchmarks/woq_bench.py $(BENCH_ARGS)

# ---- AddressSanitizer + UndefinedBehaviorSanitizer --------------------------
# qkern built with QKERN_SANITIZE=1 into build/sanitize/site, imported from
# there (PYTHONSAFEPATH keeps the source tree's qkern off sys.path) by an
# uninstrumented Python with the ASan runtime preloaded (and libstdc++ after
# it, so that ASan's __cxa_throw interceptor finds the real one when a C++
# library such as PyTorch or cuDNN throws).  Python leaks by
# design, so leak detection is off.  Reports go to files, one per process
# (test subprocesses included), and must number zero.  First the canary
# (tests/oob_canary.py) must be reported as a write past the end of a heap
# block in src/woq/ (tests/sanitizer_report.py decides).
SAN := build/sanitize
san_env = LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libstdc++.so)" \
  PYTHONPATH=$(SAN)/site PYTHONSAFEPATH=1 \
  ASAN_OPTIONS=detect_leaks=0:log_path=$(CURDIR)/$(1)/asan \
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:log_path=$(CURDIR)/$(1)/ubsan

# cuDNN opens its sub-libraries with RTLD_DEEPBIND, which ASan cannot
# interpose, so the descriptor checks against the real library (which run
# cuDNN's code, not qkern's kernels) stay out of this stage.
# Two passes: the portable path alone, and the CPU's highest level, where the
# kernel tester forces every registry kernel (ref through AMX) and the API
# tests take the automatic choices; the levels between are covered there.
SAN_ISAS = $$($(PY) -c "from qkern import dispatch as d; print(*dict.fromkeys(('ref', d.CPU_ISA)))")

sanitize: build
	QKERN_SANITIZE=1 $(PY) -m pip install -q --no-build-isolation --no-deps --upgrade --target $(SAN)/site .
	@rm -rf $(SAN)/reports $(SAN)/canary && mkdir -p $(SAN)/reports $(SAN)/canary
	@if $(call san_env,$(SAN)/canary) $(PY) tests/oob_canary.py; then \
	  echo "sanitize: FAILED: the canary's out-of-bounds write was not reported"; exit 1; fi
	@$(PY) tests/sanitizer_report.py $(SAN)/canary >/dev/null || { \
	  echo "sanitize: FAILED: the canary's write past the end was not reported in qkern's code"; \
	  cat $(SAN)/canary/*; exit 1; }
	@set -e; for isa in $(SAN_ISAS); do \
	  echo "=== sanitize: ASan + UBSan, QKERN_ISA=$$isa"; \
	  QKERN_ISA=$$isa $(call san_env,$(SAN)/reports) $(PY) $(PYTEST) --capture=sys \
	    --ignore=tests/qconv/test_cudnn_descriptors.py tests || { \
	    echo "sanitize: FAILED under QKERN_ISA=$$isa"; cat $(SAN)/reports/* 2>/dev/null; exit 1; }; \
	done
	@if [ -n "$$(ls $(SAN)/reports)" ]; then cat $(SAN)/reports/*; \
	  echo "sanitize: FAILED: $$(ls $(SAN)/reports | wc -l) ASan/UBSan reports"; exit 1; fi
	@echo "sanitize: ASan + UBSan: test suite passed under QKERN_ISA=$$(echo $(SAN_ISAS) | tr ' ' ,), 0 reports (canary reported: $$($(PY) tests/sanitizer_report.py $(SAN)/canary))"

# ---- valgrind memcheck --------------------------------------------------------
# valgrind 3.19 does not decode AVX-512 or AMX, so the ISA is capped at AVX2
# (it runs the reference and AVX2 kernels).  PYTHONMALLOC=malloc lets memcheck
# see Python's allocations; tests/valgrind-python.supp silences the
# interpreter's and glibc's own reports.
VG := build/valgrind
VALGRIND := valgrind --tool=memcheck --error-exitcode=99 --suppressions=tests/valgrind-python.supp
VG_TESTS := tests/woq/test_kernels.py tests/woq/test_woq.py
VG_ISA = $$($(PY) -c "from qkern import dispatch as d; print(d.ISA_LEVELS[min(d.ISA_LEVELS.index(d.CPU_ISA), 1)])")
vg_env = QKERN_ISA=$(VG_ISA) PYTHONMALLOC=malloc QKERN_HYPOTHESIS_PROFILE=valgrind

valgrind: build
	@rm -rf $(VG) && mkdir -p $(VG)
	@if $(vg_env) $(VALGRIND) --log-file=$(VG)/canary.log $(PY) tests/oob_canary.py; then \
	  echo "valgrind: FAILED: the canary's out-of-bounds write was not reported"; exit 1; fi
	@grep -A3 "Invalid write" $(VG)/canary.log | grep -q "gemm" || { \
	  echo "valgrind: FAILED: no invalid write in qkern's code reported for the canary"; \
	  cat $(VG)/canary.log; exit 1; }
	@echo "=== valgrind memcheck, QKERN_ISA=$(VG_ISA): $(VG_TESTS)"
	@$(vg_env) $(VALGRIND) --log-file=$(VG)/memcheck.log $(PY) $(PYTEST) --capture=sys $(VG_TESTS) || { \
	  cat $(VG)/memcheck.log; echo "valgrind: FAILED"; exit 1; }
	@echo "valgrind: memcheck, QKERN_ISA=$(VG_ISA), $(VG_TESTS): $$(grep -o 'ERROR SUMMARY.*' $(VG)/memcheck.log) (canary invalid write reported)"

# ---- fuzzing ------------------------------------------------------------------
fuzz: build
	$(PY) tests/fuzz.py --seconds $(FUZZ_SECONDS)

clean:
	rm -rf build docs/_build qkern/*.so qkern/cudnn/*.so qkern/_*.c qkern/cudnn/*.c *.egg-info
