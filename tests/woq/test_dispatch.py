"""CPU features, the QKERN_ISA cap, the registry and the kernel choice."""

import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import qkern
from qkern import dispatch

FEATURES = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_bf16",
            "avx512_vbmi", "avx512_fp16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8")


def _python(code, **env):
    full = dict(os.environ)
    full.pop("QKERN_ISA", None)
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full)


def test_cpu_features_keys_and_consistency():
    f = qkern.cpu_features()
    assert set(f) == set(FEATURES)
    assert all(isinstance(v, bool) for v in f.values())
    if f["avx512bw"] or f["avx512vl"]:
        assert f["avx512f"]
    if f["amx_bf16"] or f["amx_int8"]:
        assert f["amx_tile"]
    f["avx2"] = not f["avx2"]
    assert qkern.cpu_features()["avx2"] != f["avx2"], "cpu_features() must return a copy"


def test_cpu_features_match_proc_cpuinfo():
    try:
        with open("/proc/cpuinfo") as fh:
            flags = next(line for line in fh if line.startswith("flags")).split()
    except (OSError, StopIteration):
        pytest.skip("no /proc/cpuinfo flags line on this system")
    f = qkern.cpu_features()
    for name, flag in [("avx2", "avx2"), ("fma", "fma"), ("f16c", "f16c"),
                       ("avx512f", "avx512f"), ("avx512bw", "avx512bw"),
                       ("avx512_bf16", "avx512_bf16"), ("avx512_vbmi", "avx512vbmi"),
                       ("avx512_vnni", "avx512_vnni"),
                       ("amx_bf16", "amx_bf16")]:
        assert f[name] == (flag in flags), name


def test_a_cpu_with_avx512_bf16_but_no_vbmi_stops_at_avx512(monkeypatch):
    """The avx512_bf16 level needs AVX512_VBMI too (the bfloat16 int4
    kernel's vpermb): a Cooper Lake, BF16 without VBMI, runs avx512."""
    features = {name: True for name in FEATURES} | {"amx_tile": False, "amx_bf16": False}
    monkeypatch.setattr(dispatch, "_FEATURES", features)
    assert dispatch.ISA_LEVELS[dispatch._cpu_level()] == "avx512_bf16"
    monkeypatch.setitem(features, "avx512_vbmi", False)
    assert dispatch.ISA_LEVELS[dispatch._cpu_level()] == "avx512"


def test_registry_entries():
    ks = qkern.kernels()
    names = [k.name for k in ks]
    assert len(set(names)) == len(names)
    assert ks[0].isa == "ref" and ks[0].available
    for k in ks:
        assert k.isa in qkern.ISA_LEVELS
        assert k.name.endswith("__" + k.isa.replace("_", ""))
        assert f"_{k.mr}x{k.nr}c{k.kr}__" in k.name
        assert k.dtypes and set(k.dtypes) <= {"float32", "float16", "bfloat16"}
        assert k.available == (qkern.ISA_LEVELS.index(k.isa)
                               <= qkern.ISA_LEVELS.index(dispatch.ISA_CAP))
    for form, layout in {(k.weight_format, k.layout) for k in ks}:
        assert any(k.isa == "ref" and (k.weight_format, k.layout) == (form, layout) for k in ks), \
            f"{form} layout {layout} has no reference kernel"


def test_registry_traits_agree_with_what_the_kernels_are():
    """The traits code reads instead of names: each agrees with the entry's
    layout and with the instruction that bounds it."""
    peaks = {"vfmadd231ps ymm", "vfmadd231ps zmm", "vdpbf16ps zmm", "tdpbf16ps"}
    for k in qkern.kernels():
        assert k.kind in ("panels", "unpacked", "kblock"), k.name
        assert (k.kind == "unpacked") == (k.layout == (1, 0)), k.name
        if k.kind == "kblock":  # on packed x, split into bf16 planes
            assert (k.mr, k.nr) == (32, 32) and k.splits_x, k.name
            assert k.kr == (1 if k.weight_format == dispatch.INT4 else 2), k.name
        if k.weight_format == dispatch.INT4:
            # one packed int4 layout, any group size that is a multiple of 32,
            # x in f32 with its group sums (a K-block kernel: the sums only,
            # and panels it may read widened by the driver)
            assert k.kind in ("panels", "kblock") and k.layout == (32, 1), k.name
            assert k.group_size == 32 and k.converts_x, k.name
            assert not k.widened or k.kind == "kblock", k.name
            # dequantized to float32 by the driver, into a kernel on panels
            assert not k.dequantizes or (k.kind == "panels" and not k.widened
                                         and k.widened_bytes == 4), k.name
        else:
            assert k.weight_format == dispatch.INT8 and k.group_size == 0, k.name
            assert not k.dequantizes, k.name
        assert k.bound_by in peaks, k.name
        assert k.flushes_subnormals == (k.bound_by in ("vdpbf16ps zmm", "tdpbf16ps")), k.name
        assert not k.splits_x or set(k.dtypes) > {"bfloat16"}, k.name
        level = qkern.ISA_LEVELS.index(k.isa)
        assert set(k.features) == {f for isa in qkern.ISA_LEVELS[:level + 1]
                                   for f in dispatch._ISA_REQUIRES[isa]}, k.name


def test_each_cpu_isa_has_its_kernels():
    levels = qkern.ISA_LEVELS[:qkern.ISA_LEVELS.index(dispatch.CPU_ISA) + 1]
    built = {k.isa for k in qkern.kernels()}
    for level in levels:
        if level != "amx":
            assert level in built, f"this CPU runs {level} but the build has no {level} kernel"


@pytest.mark.parametrize("weight_format", [dispatch.INT8, dispatch.INT4])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_choice_is_highest_available_isa(dtype, weight_format):
    """The highest level wins, but for AVX-512-BF16 below
    AVX512_BF16_FROM_M_HERE rows (every M but on AMD's CPUs) and, on an AMX
    CPU, the AVX-512 level below AMX_FROM_M rows."""
    bf16_from = dispatch.AVX512_BF16_FROM_M_HERE.get(weight_format)
    np_dtype = np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    for m in (1, 2, 3, 4, 5, 6, 7, 8, 9, 64, 1000):
        bf16_ok = bf16_from is not None and m >= bf16_from
        levels = sorted({qkern.ISA_LEVELS.index(k.isa) for k in qkern.kernels()
                         if k.available and dtype in k.dtypes and k.weight_format == weight_format
                         and (k.isa != "avx512_bf16" or bf16_ok)}, reverse=True)
        kern = dispatch.choose_kernel(np_dtype, m, weight_format=weight_format)
        assert kern.available and dtype in kern.dtypes and kern.weight_format == weight_format
        below_amx = (qkern.ISA_LEVELS[levels[0]] == "amx"
                     and m < dispatch.AMX_FROM_M[weight_format][dtype])
        assert qkern.ISA_LEVELS.index(kern.isa) == levels[1 if below_amx else 0], (m, kern.name)


def _registry_up_to(monkeypatch, level: str) -> None:
    """The registry as a CPU of ``level`` sees it: every kernel up to that
    level available, none above; skips where the build has none of it."""
    import dataclasses

    top = qkern.ISA_LEVELS.index(level)
    monkeypatch.setattr(dispatch, "REGISTRY", [
        dataclasses.replace(k, available=qkern.ISA_LEVELS.index(k.isa) <= top)
        for k in dispatch.REGISTRY])
    if not any(k.isa == level for k in dispatch.REGISTRY):
        pytest.skip(f"this build has no {level} kernel (the compiler lacks it)")


@pytest.fixture
def every_kernel(monkeypatch):
    """Every compiled kernel available, as on an AMX CPU (an Intel's)."""
    import dataclasses

    if not any(k.isa == "amx" for k in qkern.kernels()):
        pytest.skip("this build has no AMX kernel (the compiler lacks AMX)")
    monkeypatch.setattr(dispatch, "REGISTRY",
                        [dataclasses.replace(k, available=True) for k in dispatch.REGISTRY])
    monkeypatch.setattr(dispatch, "AVX512_BF16_FROM_M_HERE", {})
    monkeypatch.setattr(dispatch, "AVX512_BF16_UNPACKED_FROM_M_HERE", None)


def test_amx_kernels_from_their_m(every_kernel):
    """On an AMX CPU: the AVX-512 FMA kernels below AMX_FROM_M rows (never
    the AVX-512-BF16 ones), the AMX kernels from there, their twins on
    widened panels where M needs more than WIDENED_ABOVE_ROW_BLOCKS of
    their row blocks (int8 one, int4 two)."""
    int8 = {"bfloat16": 5, "float16": 7, "float32": 7}
    int4 = {"bfloat16": 3, "float16": 4, "float32": 5}
    assert dispatch.AMX_FROM_M == {dispatch.INT8: int8, dispatch.INT4: int4}
    for name, dtype in (("bfloat16", ml_dtypes.bfloat16), ("float16", np.float16),
                        ("float32", np.float32)):
        for fmt in (dispatch.INT8, dispatch.INT4):
            assert dispatch.top_level(dtype, weight_format=fmt) == "amx"
        for m in range(1, int8[name]):
            assert dispatch.choose_kernel(dtype, m).isa == "avx512", (name, m)
        for m, want in ((int8[name], "bf16_gemm_32x32c2__amx"), (32, "bf16_gemm_32x32c2__amx"),
                        (33, "bf16w_gemm_32x32c2__amx")):
            assert dispatch.choose_kernel(dtype, m).name == want, (name, m)
        for m in range(1, int4[name]):
            assert dispatch.choose_kernel(dtype, m, weight_format=dispatch.INT4).name == (
                "f32_qb4w_gemm_8x32c1__avx512"), (name, m)
        for m, want in ((int4[name], "tile_qb4w_gemm_32x32c1__amx"),
                        (64, "tile_qb4w_gemm_32x32c1__amx"),
                        (65, "tilew_qb4w_gemm_32x32c1__amx")):
            assert dispatch.choose_kernel(dtype, m, weight_format=dispatch.INT4).name == want


def test_amx_kernels_from_their_n(every_kernel):
    """On an AMX CPU, a weight narrower than AMX_FROM_N columns runs the
    AVX-512 FMA kernels at every M, from there the AMX kernels as for a wide
    weight (n=None); the layer and the functional op pass their N."""
    int8 = {"bfloat16": 1, "float16": 128, "float32": 256}
    int4 = {"bfloat16": 64, "float16": 128, "float32": 256}
    assert dispatch.AMX_FROM_N == {dispatch.INT8: int8, dispatch.INT4: int4}
    for name, dtype in (("bfloat16", ml_dtypes.bfloat16), ("float16", np.float16),
                        ("float32", np.float32)):
        for fmt, edges in ((dispatch.INT8, int8), (dispatch.INT4, int4)):
            for m in (8, 64, 1000):
                wide = dispatch.choose_kernel(dtype, m, weight_format=fmt)
                assert wide.isa == "amx", (name, fmt, m)
                assert dispatch.choose_kernel(dtype, m, weight_format=fmt, n=edges[name]) == wide
                assert dispatch.choose_kernel(dtype, m, weight_format=fmt, n=4096) == wide
                if edges[name] > 1:
                    for n in (1, edges[name] - 1):
                        narrow = dispatch.choose_kernel(dtype, m, weight_format=fmt, n=n)
                        assert narrow.isa == "avx512", (name, fmt, m, n)


def test_a_narrow_layer_and_call_choose_by_their_n(monkeypatch):
    """WoqLinear, Int4Linear and the functional ops ask the rule with their N."""
    asked = []
    real = dispatch.choose_kernel

    def spy(*args, **kwargs):
        asked.append(kwargs.get("n"))
        return real(*args, **kwargs)

    for module in (qkern.woq, qkern.woq_int4):
        monkeypatch.setattr(module, "choose_kernel", spy)
    x = np.ones((300, 64), np.float32)
    w = np.ones((24, 64), np.int8)
    s = np.ones(24, np.float32)
    qkern.weight_int8pack_mm(x, w, s)
    qkern.WoqLinear(w, s)(x)
    q, sz = qkern.quantize_int4(np.ones((24, 64), np.float32), 32)
    qkern.weight_int4pack_mm(x, qkern.pack_int4(q), 32, sz)
    qkern.Int4Linear(qkern.pack_int4(q), 32, sz)(x)
    assert asked and all(n == 24 for n in asked), asked


@pytest.mark.parametrize("vendor", ["GenuineIntel", "AuthenticAMD"])
def test_avx512_bf16_level_from_its_m_on_amd_only(monkeypatch, vendor):
    """With every kernel up to AVX-512-BF16 available (a CPU without AMX):
    on Intel's, bfloat16 runs the AVX-512 FMA kernels at every M (vdpbf16ps
    at half the FMA's rate there); on AMD's, the vdpbf16ps kernels from
    AVX512_BF16_FROM_M (int8 2 rows, int4 1), the FMA below, and for int8
    the kernel on widened panels above six of its 8-row blocks; the
    functional op's vdpbf16ps GEMV from AVX512_BF16_UNPACKED_FROM_M (2
    rows).  The tuner times both levels either way (TUNED_WITH)."""
    _registry_up_to(monkeypatch, "avx512_bf16")
    assert dispatch.AVX512_BF16_FROM_M == {"AuthenticAMD": {dispatch.INT8: 2, dispatch.INT4: 1}}
    assert dispatch.WIDENED_ABOVE_ROW_BLOCKS["avx512_bf16"] == {dispatch.INT8: 6}
    assert dispatch.AVX512_BF16_UNPACKED_FROM_M == {"AuthenticAMD": 2}
    monkeypatch.setattr(dispatch, "AVX512_BF16_FROM_M_HERE",
                        dispatch.AVX512_BF16_FROM_M.get(vendor, {}))
    monkeypatch.setattr(dispatch, "AVX512_BF16_UNPACKED_FROM_M_HERE",
                        dispatch.AVX512_BF16_UNPACKED_FROM_M.get(vendor))
    assert qkern.tuning.TUNED_WITH["avx512_bf16"] == ("avx512",)
    for fmt, from_m in ((dispatch.INT8, 2), (dispatch.INT4, 1)):
        assert dispatch.top_level(ml_dtypes.bfloat16, weight_format=fmt) == "avx512_bf16"
        for m in (1, 2, 3, 8, 9, 64, 1000):
            want = "avx512_bf16" if vendor == "AuthenticAMD" and m >= from_m else "avx512"
            assert dispatch.choose_kernel(ml_dtypes.bfloat16, m, weight_format=fmt).isa == (
                want), (fmt, m)
        for dtype in (np.float32, np.float16):
            assert dispatch.choose_kernel(dtype, 64, weight_format=fmt).isa == "avx512"
    for m in (1, 2, 3, 24, 25):  # the functional op's GEMV, up to 3 calls of it
        kern = dispatch.choose_kernel(ml_dtypes.bfloat16, m, unpacked_ok=True)
        gemv = ("bf16_gemv_8x1c0__avx512bf16" if vendor == "AuthenticAMD" and m >= 2
                else "f32_gemv_8x1c0__avx512")
        assert (kern.name == gemv if m <= 24 else kern.kind != "unpacked"), (m, kern.name)
    if vendor == "AuthenticAMD":
        for m, want in ((1, "f32_gemm_1x32c2__avx512"), (2, "bf16_gemm_8x32c2__avx512bf16"),
                        (48, "bf16_gemm_8x32c2__avx512bf16"),
                        (49, "bf16w_gemm_8x32c2__avx512bf16"),
                        (1000, "bf16w_gemm_8x32c2__avx512bf16")):
            assert dispatch.choose_kernel(ml_dtypes.bfloat16, m).name == want, m
        assert dispatch.choose_kernel(ml_dtypes.bfloat16, 1000,
                                      weight_format=dispatch.INT4).name == (
            "bf16_qb4w_gemm_8x32c1__avx512bf16")


def test_cpu_vendor_is_cpuids_and_sets_the_levels_passed_over():
    """CPU_VENDOR is the vendor the OS reports (cpuid leaf 0), and the
    static rule takes AVX-512-BF16 from that vendor's M."""
    try:
        with open("/proc/cpuinfo") as fh:
            reported = next((line.split(":", 1)[1].strip() for line in fh
                             if line.startswith("vendor_id")), None)
    except OSError:
        reported = None
    if reported is None:
        pytest.skip("no vendor_id in /proc/cpuinfo to compare with")
    assert dispatch.CPU_VENDOR == reported
    assert dispatch.AVX512_BF16_FROM_M_HERE == dispatch.AVX512_BF16_FROM_M.get(reported, {})
    assert dispatch.AVX512_BF16_UNPACKED_FROM_M_HERE == (
        dispatch.AVX512_BF16_UNPACKED_FROM_M.get(reported))
    info = _python("import qkern.__main__ as m; print(m.info())").stdout
    assert f"CPU vendor: {reported}" in info


def test_functional_op_reads_the_unpacked_weight_with_the_highest_gemv(every_kernel):
    """weight_int8pack_mm's unpacked kernel is the highest level's, for up
    to UNPACKED_CALLS of its calls (AMX: 4 x 32 rows), of that level's the
    one taking M in the fewest calls, the narrower on a tie (AMX: the 8-row
    kernel up to 8 rows), but below AMX_UNPACKED_FROM_M rows the AVX-512
    GEMV's (up to 3 x 8 rows); above that the weight is packed, not read by
    a lower level's GEMV."""
    assert dispatch.UNPACKED_CALLS == {"avx2": 4, "avx512": 3, "avx512_bf16": 3, "amx": 4}
    for dtype in (np.float32, np.float16, ml_dtypes.bfloat16):
        from_m = dispatch.AMX_UNPACKED_FROM_M[np.dtype(dtype).name]
        assert 1 < from_m <= 8
        for m in (1, from_m - 1):
            assert dispatch.choose_kernel(dtype, m, unpacked_ok=True).name == (
                "f32_gemv_8x1c0__avx512"), (dtype, m)
        for m in (from_m, 8):
            assert dispatch.choose_kernel(dtype, m, unpacked_ok=True).name == (
                "bf16_gemv_8x1c0__amx"), (dtype, m)
        for m in (9, 32, 128):
            assert dispatch.choose_kernel(dtype, m, unpacked_ok=True).name == (
                "bf16_gemv_32x1c0__amx"), (dtype, m)
        kern = dispatch.choose_kernel(dtype, 129, unpacked_ok=True)
        assert kern.isa == "amx" and kern.kind != "unpacked"


@pytest.fixture
def avx2_registry(monkeypatch):
    """The registry as an AVX2 CPU sees it: every kernel up to that level
    available, none above."""
    _registry_up_to(monkeypatch, "avx2")


def test_packed_int8_kernel_makes_the_fewest_passes(avx2_registry):
    """On the AVX2 level (every kernel up to it available, as on an AVX2
    CPU): every kernel runs each row count without a duplicated row, so
    the one with the fewest passes over the weight wins, the narrower on a
    tie (M = 2 takes one pass of the 4-row kernel, not two of the 1-row)."""
    want = {1: "1x16", 2: "4x16", 3: "4x16", 4: "4x16", 5: "6x16", 6: "6x16", 7: "4x16",
            8: "4x16", 9: "6x16", 12: "6x16", 13: "6x16", 16: "6x16", 1000: "6x16"}
    for m, tile in want.items():
        assert dispatch.choose_kernel(np.float32, m).name == f"f32_gemm_{tile}c1__avx2", m


def test_int4_dequantized_kernel_from_its_m(avx2_registry):
    """On the AVX2 level (every kernel up to it available, as on an AVX2
    CPU), int4 takes the kernel on dequantized weights from
    DEQUANTIZED_FROM_M["avx2"] rows and the group-sum kernel below, every
    dtype."""
    edge = dispatch.DEQUANTIZED_FROM_M["avx2"]
    for dtype in (np.float32, np.float16, ml_dtypes.bfloat16):
        for m, want in ((1, "f32_qb4w_gemm_6x32c1__avx2"), (edge - 1, "f32_qb4w_gemm_6x32c1__avx2"),
                        (edge, "f32dq_qb4w_gemm_6x32c1__avx2"),
                        (1000, "f32dq_qb4w_gemm_6x32c1__avx2")):
            assert dispatch.choose_kernel(dtype, m, weight_format=dispatch.INT4).name == want


@pytest.mark.parametrize("level, packed, dequantized", [
    ("avx512", "f32_qb4w_gemm_8x32c1__avx512", "f32dq_qb4w_gemm_8x32c1__avx512"),
    ("avx512_bf16", "f32_qb4w_gemm_8x32c1__avx512", "f32dq_qb4w_gemm_8x32c1__avx512")])
def test_dequantized_int4_kernel_on_avx512_from_its_m(monkeypatch, level, packed, dequantized):
    """With every kernel up to AVX-512 (or AVX-512-BF16) available: float32
    and float16 int4 take the AVX-512 kernel on dequantized weights from
    DEQUANTIZED_FROM_M["avx512"] rows; bfloat16 on an AVX-512-BF16 AMD CPU
    keeps the vdpbf16ps kernel on packed int4 (that level has no
    dequantizing one)."""
    _registry_up_to(monkeypatch, level)
    monkeypatch.setattr(dispatch, "AVX512_BF16_FROM_M_HERE",
                        dispatch.AVX512_BF16_FROM_M["AuthenticAMD"])
    assert set(dispatch.DEQUANTIZED_FROM_M) == {"avx2", "avx512"}
    edge = dispatch.DEQUANTIZED_FROM_M["avx512"]
    for dtype in (np.float32, np.float16):
        for m, want in ((1, packed), (edge - 1, packed), (edge, dequantized), (1000, dequantized)):
            assert dispatch.choose_kernel(dtype, m, weight_format=dispatch.INT4).name == want, m
    if level == "avx512_bf16":
        for m in (1, edge, 1000):
            kern = dispatch.choose_kernel(ml_dtypes.bfloat16, m, weight_format=dispatch.INT4)
            assert kern.name == "bf16_qb4w_gemm_8x32c1__avx512bf16", m


@pytest.mark.parametrize("setting", ["UNPACKED_CALLS", "AMX_UNPACKED_FROM_M",
                                     "WIDENED_ABOVE_ROW_BLOCKS", "AMX_FROM_M", "AMX_FROM_N",
                                     "AVX512_BF16_FROM_M", "AVX512_BF16_UNPACKED_FROM_M",
                                     "AVX512_BF16_FROM_M_HERE", "DEQUANTIZED_FROM_M"])
def test_static_rule_settings_are_read_only(setting):
    """The rule's mappings (and the ones in them) refuse changes in place: the
    remembered choices follow a setting replaced, never one edited."""
    mapping = getattr(dispatch, setting)
    with pytest.raises(TypeError):
        mapping["new"] = 1
    for inner in mapping.values():
        if hasattr(inner, "keys"):
            with pytest.raises(TypeError):
                inner["new"] = 1


def test_remembered_choices_are_the_rules_and_follow_a_replaced_setting(monkeypatch):
    """choose_kernel gives what the rule computes for every argument it takes,
    remembered or not, keeps at most _CHOICES_KEPT choices, and forgets them
    when a setting is replaced."""
    monkeypatch.setattr(dispatch, "_CHOICES_KEPT", 16)
    calls = [(dtype, m, layout, unpacked_ok, fmt, n)
             for dtype in ("float32", "bfloat16") for m in (1, 2, 5, 33, 64, 300)
             for fmt in (dispatch.INT8, dispatch.INT4)
             for layout, unpacked_ok in ((None, False), (None, True))
             for n in (None, 32, 4096)
             if not (unpacked_ok and fmt == dispatch.INT4)]
    calls += [("float32", m, k.layout, False, dispatch.INT8, None) for m in (1, 64)
              for k in dispatch.REGISTRY if k.available and k.weight_format == dispatch.INT8]
    for args in calls + calls[::-1]:
        dtype, m, layout, unpacked_ok, fmt, n = args
        kern = dispatch.choose_kernel(dtype, m, layout, unpacked_ok, fmt, n)
        assert kern == dispatch._static_rule(dispatch._rule_settings(), dtype, m,
                                             None if layout is None else tuple(layout),
                                             unpacked_ok, fmt, n), args
        assert len(dispatch._choices[1]) <= 16
    first = dispatch.choose_kernel("float32", 1)
    monkeypatch.setattr(dispatch, "REGISTRY", tuple(k for k in dispatch.REGISTRY if k != first))
    assert dispatch.choose_kernel("float32", 1) not in (None, first)
    monkeypatch.undo()
    assert dispatch.choose_kernel("float32", 1) == first
    assert dispatch.choose_kernel("float32", np.array(1)) == first  # unhashable: computed


def test_the_rule_reads_the_settings_it_is_given():
    """The rule computes from the snapshot of settings its choice is remembered
    under, not from the module's settings of the moment (which another thread may
    replace meanwhile)."""
    settings = dispatch._rule_settings()
    first = dispatch._static_rule(settings, "float32", 1, None, False, dispatch.INT8, None)
    fewer = (tuple(k for k in dispatch.REGISTRY if k != first),) + settings[1:]
    assert dispatch._static_rule(fewer, "float32", 1, None, False, dispatch.INT8, None) != first
    assert dispatch.choose_kernel("float32", 1) == first


def test_a_setting_replaced_by_a_plain_dict_is_read_on_every_call(monkeypatch):
    """A mutable setting (a test's plain dict or list) turns the remembering off, so
    that a change made to it in place takes effect too."""
    registry = [k for k in dispatch.REGISTRY]
    monkeypatch.setattr(dispatch, "REGISTRY", registry)
    first = dispatch.choose_kernel("float32", 1)
    registry.remove(first)
    assert dispatch.choose_kernel("float32", 1) not in (None, first)
    monkeypatch.undo()
    assert dispatch.choose_kernel("float32", 1) == first


def test_isa_cap_bad_value_is_a_clear_error():
    r = _python("import qkern", QKERN_ISA="sse9")
    assert r.returncode != 0
    assert "QKERN_ISA='sse9' is not one of ref, avx2, avx512, avx512_bf16, amx" in r.stderr


def test_isa_cap_above_cpu_is_a_clear_error():
    if dispatch.CPU_ISA == qkern.ISA_LEVELS[-1]:
        pytest.skip("this CPU runs every ISA level; no level is above it")
    above = qkern.ISA_LEVELS[qkern.ISA_LEVELS.index(dispatch.CPU_ISA) + 1]
    r = _python("import qkern", QKERN_ISA=above)
    assert r.returncode != 0 and "asks for an ISA this CPU (or OS) cannot run" in r.stderr


def test_isa_cap_ref_limits_registry():
    r = _python("import qkern; print(sorted({k.isa for k in qkern.kernels() if k.available}))",
                QKERN_ISA="ref")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "['ref']"


def test_forcing_a_kernel_above_the_cap_is_refused():
    code = ("import numpy as np, qkern\n"
            "k = [k for k in qkern.kernels() if k.isa != 'ref'][0]\n"
            "try:\n"
            "    qkern.WoqLinear(np.ones((2, 2), np.int8), np.ones(2, np.float32), kernel=k.name)\n"
            "except ValueError as e:\n"
            "    print(e)\n")
    r = _python(code, QKERN_ISA="ref")
    assert r.returncode == 0, r.stderr
    assert "above this process's cap 'ref'" in r.stdout


def test_verbose_logs_the_choice():
    code = ("import numpy as np, qkern\n"
            "qkern.weight_int8pack_mm(np.ones((1, 4), np.float32), np.ones((2, 4), np.int8),"
            " np.ones(2, np.float32))\n")
    r = _python(code, QKERN_VERBOSE="1")
    assert r.returncode == 0, r.stderr
    assert "qkern: using " in r.stderr and "dtype=float32 m=1" in r.stderr
    r = _python(code, QKERN_VERBOSE=" 0\n")  # read without the whitespace around it
    assert r.returncode == 0 and "qkern: using " not in r.stderr, r.stderr


def test_unpacked_kernel_only_where_packing_would_dominate():
    unpacked = [k for k in qkern.kernels()
                if k.available and k.kind == "unpacked" and k.isa != "ref"]
    for dtype in (np.float32, np.float16, ml_dtypes.bfloat16):
        name = np.dtype(dtype).name
        # A layer packs once, so it never gets the unpacked layout.
        assert dispatch.choose_kernel(dtype, 1).kind != "unpacked"
        bf16_from = dispatch.AVX512_BF16_UNPACKED_FROM_M_HERE
        for m in (1, 2, 3, 4, 8, 9, 16, 17, 32, 33, 64, 129):
            kern = dispatch.choose_kernel(dtype, m, unpacked_ok=True)
            # the highest level's (AVX-512-BF16's where the static rule
            # takes that level), but on AMX the next level's for few rows;
            # of the level's, the fewest calls, the narrower on a tie
            levels = sorted({k.isa for k in unpacked if name in k.dtypes and (
                k.isa != "avx512_bf16" or (bf16_from is not None and m >= bf16_from))},
                key=qkern.ISA_LEVELS.index, reverse=True)
            level = levels[0] if levels else None
            if level == "amx" and len(levels) > 1 and m < dispatch.AMX_UNPACKED_FROM_M[name]:
                level = levels[1]
            want = min((k for k in unpacked if k.isa == level and name in k.dtypes),
                       key=lambda k: (-(-m // k.mr), k.mr), default=None)
            fits = want is not None and m <= dispatch.UNPACKED_CALLS[want.isa] * want.mr
            assert (kern == want if fits else kern.kind != "unpacked"), (name, m, kern.name)


def test_a_pickled_layer_whose_forced_kernel_this_machine_lacks_takes_the_static_choice():
    for k in qkern.kernels():
        assert dispatch.runnable_here(k.name) == (k.name if k.available else None)
    assert dispatch.runnable_here("no_such_kernel") is None
    assert dispatch.runnable_here(None) is None
    rng = np.random.default_rng(11)
    w = rng.integers(-128, 128, (40, 96), dtype=np.int8)
    s = rng.uniform(0.01, 0.02, 40).astype(np.float32)
    wf = rng.standard_normal((40, 128)).astype(np.float32)
    layers = [(qkern.WoqLinear(w, s, kernel="f32_gemm_4x16c1__ref"), qkern.WoqLinear(w, s), 96),
              (qkern.Int4Linear.from_float(wf, 64, kernel="f32_qb4w_gemm_4x32c1__ref"),
               qkern.Int4Linear.from_float(wf, 64), 128)]
    for forced, static, k in layers:
        state = forced.__getstate__()
        assert state["kernel"] is not None
        state["kernel"] = "no_such_kernel"  # as a kernel of another CPU reads here
        clone = type(forced).__new__(type(forced))
        clone.__setstate__(state)
        assert clone._forced is None
        x = rng.standard_normal((3, k)).astype(np.float32)
        assert clone(x).tobytes() == static(x).tobytes()
        assert repr(clone) == repr(static)
