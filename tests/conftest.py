"""Shared fixtures: hypothesis profiles and the kernels this process may run."""

import importlib.util
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

import qkern
from bench_support import runtimes_module
from process_support import asan_loaded

settings.register_profile(
    "ci", max_examples=300, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=200, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
# make valgrind: every test there runs some 50 times slower
settings.register_profile(
    "valgrind", max_examples=20, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("QKERN_HYPOTHESIS_PROFILE", "ci"))


def pytest_report_header(config):
    from qkern import dispatch
    avail = [k.name for k in qkern.kernels() if k.available]
    return [f"qkern: CPU ISA {dispatch.CPU_ISA}, cap {dispatch.ISA_CAP} "
            f"(QKERN_ISA={os.environ.get('QKERN_ISA', '')!r}), "
            f"from {os.path.dirname(qkern.__file__)}",
            f"qkern kernels available: {', '.join(avail)}"]


@pytest.fixture(autouse=True)
def _no_runtime_peers_under_asan(monkeypatch):
    """Under make sanitize the benchmarks run without OpenVINO and ONNX
    Runtime: OpenVINO loads its libraries with RTLD_DEEPBIND, which
    AddressSanitizer refuses by ending the process."""
    if asan_loaded():
        monkeypatch.setattr(runtimes_module(), "available",
                            lambda: {"openvino": None, "onnxruntime": None})


def _kernels_for(dtype, weight_format: str) -> list:
    """The kernels this process may run on weights of ``weight_format`` for
    activations of ``dtype``."""
    return [k for k in qkern.kernels()
            if k.available and dtype.name in k.dtypes and k.weight_format == weight_format]


def woq_bound_traits(dtype) -> dict:
    """The arguments of the int8 bound (tests/reference.py) that cover every
    int8 kernel this process may run for activations of ``dtype``: ``daz``
    where one flushes subnormals, ``planes`` the most bf16 planes one splits
    x into."""
    dtype = np.dtype(dtype)
    kernels = _kernels_for(dtype, qkern.dispatch.INT8)
    return {"daz": any(k.flushes_subnormals for k in kernels),
            "planes": max(k.planes(dtype) for k in kernels)}


def int4_bound_traits(x, n: int) -> dict:
    """The arguments of the int4 bound (tests/reference.py) that cover the
    int4 call on activations ``x``: ``daz`` where a kernel this process may
    run for x's dtype flushes subnormals (``bf16_qb4w``, ``tile_qb4w``),
    ``planes`` the most bf16 planes one splits x into (``tile_qb4w``),
    ``byte_sums`` where one sums the high nibbles from byte sums
    (``f32_qb4w``), and ``dequantized`` where the static rule runs a kernel
    on dequantized weights for x's rows and ``n`` columns (``f32dq_qb4w``;
    the tests that use it run without autotuning)."""
    dtype = np.asarray(x).dtype
    rows = int(np.prod(np.shape(x)[:-1]))
    kernels = _kernels_for(dtype, qkern.dispatch.INT4)
    static = qkern.dispatch.choose_kernel(dtype, rows, weight_format=qkern.dispatch.INT4, n=n)
    return {"daz": any(k.flushes_subnormals for k in kernels),
            "planes": max(k.planes(dtype) for k in kernels),
            "byte_sums": any(k.sums_bytes for k in kernels),
            "dequantized": static.dequantizes}


def kernel_params(weight_format: str = "int8_per_channel"):
    """Every registry kernel on weights of ``weight_format``, as pytest
    params; those above the ISA cap are skipped."""
    out = []
    for k in qkern.kernels():
        if k.weight_format != weight_format:
            continue
        marks = () if k.available else pytest.mark.skip(
            reason=f"{k.name} needs ISA {k.isa}, above this process's cap "
                   f"{qkern.dispatch.ISA_CAP} (CPU or QKERN_ISA)")
        out.append(pytest.param(k, id=k.name, marks=marks))
    return out


def pytest_configure(config):
    # CI sets QKERN_REQUIRE_TORCH=1: the PyTorch tests must run there, not skip.
    if os.environ.get("QKERN_REQUIRE_TORCH") == "1" and importlib.util.find_spec("torch") is None:
        raise pytest.UsageError("QKERN_REQUIRE_TORCH=1, but PyTorch is not installed")
