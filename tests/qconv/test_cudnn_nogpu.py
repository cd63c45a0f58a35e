"""The cuDNN path's logic that runs without a GPU: import isolation, library
discovery and its errors, the plan cache, the plan key, channel padding,
layout/dtype/shape/alignment checks, error types and DLPack export."""

import dataclasses
import os
import re
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import qkern
from qkern._conv_spec import geometry
from qkern.cudnn import CudnnError, CudnnUnavailableError, _conv, _device, _dlpack, _errors
from qkern.cudnn._plancache import PlanCache
from qkern.cudnn._spec import GraphSpec

# Hides every CUDA-related package from the child, as on a machine without them.
BLOCK_CUDA = textwrap.dedent("""
    import importlib.abc, sys
    class _Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split('.')[0] in ('cuda', 'nvidia', 'cudnn', 'cupy', 'torch'):
                raise ImportError(f'{name} is hidden by the test')
    sys.meta_path.insert(0, _Block())
""")


def _run_child(code, env_extra=None):
    env = {k: v for k, v in os.environ.items() if k != "CUDNN_PATH"}
    env.update(env_extra or {})
    proc = subprocess.run([sys.executable, "-c", BLOCK_CUDA + textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    return proc.stdout


def test_import_and_cpu_path_without_any_cuda_package():
    out = _run_child("""
        import numpy as np, qkern
        x = np.ones((1, 3, 3, 2), np.int8); w = np.ones((1, 3, 3, 2), np.int8)
        y = qkern.qconv2d(x, w, act_scale=1.0, weight_scale=1.0, out_scale=2.0)
        assert y.item() == 9, y
        maps = open('/proc/self/maps').read()
        assert 'libcudnn' not in maps and 'libcuda.so' not in maps
        assert not [m for m in sys.modules if m.split('.')[0] in ('cuda', 'nvidia')]
        for call in (qkern.cudnn.load,
                     lambda: qkern.qconv2d(type('Fake', (), {'__dlpack__': None})(), w,
                                           act_scale=1.0, weight_scale=1.0, out_scale=1.0)):
            try:
                call()
            except qkern.cudnn.CudnnUnavailableError as e:
                assert 'pip install qkern[cuda]' in str(e), e
                print(e)
            else:
                raise AssertionError('no CudnnUnavailableError')
        print(qkern.cudnn.unavailable_reason())
    """)
    lines = out.strip().splitlines()
    assert "cuDNN 9 was not found" in lines[0] and "cuda-pathfinder is not installed" in lines[0]
    assert "cuda.core / cuda.bindings are not installed" in lines[1]
    assert lines[2] == lines[1]  # the reason is the error the first CUDA call raises


def test_import_does_not_load_cuda_even_when_installed():
    out = subprocess.run(
        [sys.executable, "-c",
         "import sys, qkern; print('libcudnn' in open('/proc/self/maps').read(),"
         " sorted({m.split('.')[0] for m in sys.modules} & {'cuda', 'nvidia', 'cudnn'}))"],
        capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False []"


def test_cudnn_path_with_a_broken_library(tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libcudnn.so.9").write_bytes(b"not an ELF file")
    out = _run_child("""
        import qkern
        try:
            qkern.cudnn.load()
        except qkern.cudnn.CudnnUnavailableError as e:
            print(e)
    """, {"CUDNN_PATH": str(tmp_path)})
    assert "CUDNN_PATH: cannot load" in out and str(tmp_path) in out and "qkern[cuda]" in out


def test_cudnn_path_without_library_is_reported(tmp_path):
    out = _run_child("""
        import qkern
        try:
            qkern.cudnn.load()
        except qkern.cudnn.CudnnUnavailableError as e:
            print(e)
    """, {"CUDNN_PATH": str(tmp_path)})
    assert f"CUDNN_PATH={tmp_path} has no lib/libcudnn.so.9" in out


def test_no_device_is_unavailable_not_a_crash():
    pytest.importorskip("cuda.core", reason="needs cuda-core installed (make test installs it)")
    if os.path.exists("/dev/nvidia0"):
        pytest.skip("this machine has a GPU")
    x = type("FakeCuda", (), {"__cuda_array_interface__": {
        "shape": (1, 4, 4, 4), "typestr": "|i1", "data": (1 << 20, False), "version": 3}})()
    with pytest.raises(CudnnUnavailableError, match=r"no CUDA driver or device.*qkern\[cuda\]"):
        qkern.qconv2d(x, np.zeros((4, 3, 3, 4), np.int8), act_scale=1.0, weight_scale=1.0,
                      out_scale=1.0)
    with pytest.raises(CudnnUnavailableError, match="no usable CUDA device 0"):
        qkern.cudnn.QConv2d(np.zeros((4, 3, 3, 4), np.int8), act_scale=1.0, weight_scale=1.0,
                            out_scale=1.0)
    assert re.search(r"no CUDA driver or device.*qkern\[cuda\]", qkern.cudnn.unavailable_reason())


def test_cudnn_error_message_and_status_names():
    e = CudnnError(3002, "finalize EXECUTION_PLAN", "shape not supported").with_problem("x[1, 4]")
    assert str(e) == ("CUDNN_STATUS_NOT_SUPPORTED_SHAPE (3002) in finalize EXECUTION_PLAN: "
                      "shape not supported [problem: x[1, 4]]")
    assert (e.status, e.status_name, e.step, e.problem) == (
        3002, "CUDNN_STATUS_NOT_SUPPORTED_SHAPE", "finalize EXECUTION_PLAN", "x[1, 4]")
    assert _errors.status_name(2003) == "CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER"
    assert _errors.status_name(12345) == "CUDNN_STATUS_12345"
    assert issubclass(CudnnError, RuntimeError) and issubclass(CudnnUnavailableError, RuntimeError)


# ---------------------------------------------------------------- plan cache


def test_plan_cache_lru_and_counters():
    cache = PlanCache(maxsize=2)
    built = []

    def builder(k):
        return lambda: built.append(k) or f"plan-{k}"

    assert cache.get("a", builder("a")) == "plan-a"
    assert cache.get("b", builder("b")) == "plan-b"
    assert cache.get("a", builder("a")) == "plan-a"          # hit; a is now most recent
    assert cache.get("c", builder("c")) == "plan-c"          # evicts b
    assert cache.get("a", builder("a")) == "plan-a"
    assert cache.get("b", builder("b")) == "plan-b"          # rebuilt
    assert built == ["a", "b", "c", "b"]
    assert cache.info() == (2, 4, 2, 2)
    cache.clear()
    assert cache.info() == (0, 0, 2, 0)
    with pytest.raises(ValueError):
        PlanCache(0)


def test_plan_cache_builds_each_key_once_across_threads():
    cache = PlanCache(maxsize=8)
    counts = {}
    lock = threading.Lock()

    def build(k):
        def f():
            with lock:
                counts[k] = counts.get(k, 0) + 1
            time.sleep(0.02)
            return k
        return f

    results = []
    threads = [threading.Thread(target=lambda i=i: results.append(cache.get(i % 3, build(i % 3))))
               for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counts == {0: 1, 1: 1, 2: 1}
    assert sorted(results) == sorted(i % 3 for i in range(24))
    info = cache.info()
    assert info.hits + info.misses == 24 and info.currsize == 3


def test_plan_cache_build_error_propagates_and_is_not_cached():
    cache = PlanCache(maxsize=4)

    def fail():
        raise CudnnError(3000, "choose an engine")

    with pytest.raises(CudnnError):
        cache.get("k", fail)
    assert cache.get("k", lambda: "ok") == "ok"


def test_global_plan_cache_info():
    info = qkern.cudnn.plan_cache_info()
    assert info.maxsize >= 1 and info.currsize <= info.maxsize


# ---------------------------------------------------------------- the plan key


def _spec(**changes):
    g = geometry((2, 8, 8, 16), (32, 3, 3, 16), padding=1)
    spec = _conv.graph_spec(g, bias=True, relu=False, per_channel=False)
    return dataclasses.replace(spec, **changes)


def test_plan_key_depends_on_every_parameter():
    base = _spec()
    key = _conv.plan_key(base, False, 92801)
    same = _conv.plan_key(_spec(), False, 92801)
    assert key == same and hash(key) == hash(same)
    changed = {
        "x_dims": (3, 16, 8, 8), "w_dims": (32, 16, 5, 5), "y_dims": (2, 32, 7, 8),
        "x_strides": (1, 1, 1, 1), "w_strides": (1, 1, 1, 1), "y_strides": (1, 1, 1, 1),
        "stride": (2, 1), "dilation": (1, 2), "pre_pad": (0, 1), "post_pad": (1, 0),
        "bias": False, "relu": True, "per_channel": True, "alignments": (16, 16, 4, 16, 16),
        "device": 1, "dtypes": ("int8", "int8", "float32", "uint8"),
    }
    assert set(changed) == {f.name for f in dataclasses.fields(GraphSpec)}
    keys = {key}
    for field, value in changed.items():
        k = _conv.plan_key(_spec(**{field: value}), False, 92801)
        assert k != key, field
        keys.add(k)
    keys.add(_conv.plan_key(base, True, 92801))
    keys.add(_conv.plan_key(base, False, 92900))
    assert len(keys) == len(changed) + 3


def test_graph_spec_pads_channels_per_group():
    g = geometry((1, 6, 6, 6), (10, 3, 3, 3), groups=2, padding=1, stride=2, dilation=(1, 2))
    s = _conv.graph_spec(g, bias=False, relu=True, per_channel=True, alignments=(16, 16, 8, 16, 4))
    assert s.x_dims == (1, 8, 6, 6) and s.w_dims == (16, 4, 3, 3) and s.y_dims == (1, 16, 3, 2)
    assert s.x_strides == (6 * 6 * 8, 1, 6 * 8, 8) and s.w_strides == (36, 1, 12, 4)
    assert s.y_strides == (3 * 2 * 16, 1, 2 * 16, 16)
    assert (s.stride, s.dilation, s.pre_pad, s.post_pad) == ((2, 2), (1, 2), (1, 1), (1, 1))
    assert s.alignments == (16, 16, 8, 16, 4)


def test_pad_weight_and_channels():
    rng = np.random.default_rng(0)
    w = rng.integers(-128, 128, (6, 3, 3, 3), dtype=np.int8)        # groups=2: og=3, cg=3
    p = _conv.pad_weight(w, 2)
    assert p.shape == (8, 3, 3, 4)
    np.testing.assert_array_equal(p[0:3, :, :, :3], w[0:3])
    np.testing.assert_array_equal(p[4:7, :, :, :3], w[3:6])
    assert not p[3].any() and not p[7].any() and not p[..., 3].any()
    v = np.arange(1, 7, dtype=np.float32)
    np.testing.assert_array_equal(_conv.pad_channels(v, 2), [1, 2, 3, 0, 4, 5, 6, 0])
    np.testing.assert_array_equal(_conv.pad_channels(v, 1), [1, 2, 3, 4, 5, 6, 0, 0])
    w4 = rng.integers(-128, 128, (8, 1, 1, 4), dtype=np.int8)
    np.testing.assert_array_equal(_conv.pad_weight(w4, 1), w4)


# ---------------------------------------------------------------- layouts and checks


def _aspec(shape, strides=None, ptr=1 << 20, dtype=np.int8, device=0):
    if strides is None:
        strides = _device._c_strides(shape)
    return _device.ArraySpec(ptr, tuple(shape), tuple(strides), np.dtype(dtype), device)


def test_alignment():
    assert [_device.alignment(p) for p in (0, 1, 2, 4, 8, 16, 32, 4096 + 4, 4096 + 8)] == \
        [16, 1, 2, 4, 8, 16, 16, 4, 8]


def test_pixel_pitch_and_layout_errors():
    assert _device.pixel_pitch("x", _aspec((2, 3, 4, 5))) == 5
    # a channel slice of a wider NHWC tensor: pixels 8 apart
    assert _device.pixel_pitch("x", _aspec((2, 3, 4, 5), (96, 32, 8, 1))) == 8
    assert _device.pixel_pitch("x", _aspec((1, 1, 1, 5), (5, 5, 5, 1))) == 5
    for strides in [(60, 20, 5, 2), (60, 1, 15, 3), (100, 20, 5, 1), (60, 20, 4, 1)]:
        with pytest.raises(ValueError, match="NHWC memory with unit channel stride"):
            _device.pixel_pitch("x", _aspec((2, 3, 4, 5), strides))


def test_staging_decisions():
    dense = _aspec((1, 4, 4, 8))
    assert vars(_conv.staging(dense, 1 << 20, 8, 8)) == {"x": False, "y": False, "pitch": 8}
    assert _conv.staging(_aspec((1, 4, 4, 3)), 1 << 20, 3, 8).x              # C=3 pads to 4
    assert _conv.staging(dense, 1 << 20, 8, 5).y                              # O=5 pads to 8
    assert _conv.staging(_aspec((1, 4, 4, 8), (256, 64, 16, 1)), 1 << 20, 8, 8).x  # not dense
    assert _conv.staging(_aspec((1, 4, 4, 8), ptr=(1 << 20) + 2), 1 << 20, 8, 8).x  # misaligned x
    assert _conv.staging(dense, (1 << 20) + 1, 8, 8).y                         # misaligned out
    assert not _conv.staging(_aspec((1, 4, 4, 8), ptr=(1 << 20) + 4), (1 << 20) + 4, 8, 8).x


def test_device_argument_checks():
    out = _aspec((1, 2, 2, 4), ptr=1 << 24)
    x = _aspec((1, 4, 4, 4), ptr=1 << 20)
    _conv.check_out(out, (1, 2, 2, 4), 0, {"x": x})
    cases = [
        (_aspec((1, 2, 2, 4), dtype=np.uint8, ptr=1 << 24), TypeError, "out: expected dtype int8"),
        (_aspec((1, 2, 2, 5), ptr=1 << 24), ValueError, r"out: expected shape \(1, 2, 2, 4\)"),
        (_aspec((1, 2, 2, 4), ptr=1 << 24, device=1), ValueError, "out: on CUDA device 1"),
        (_aspec((1, 2, 2, 4), ptr=1 << 24, device=-1), ValueError, "got host memory"),
        (_aspec((1, 2, 2, 4), (32, 16, 8, 1), ptr=1 << 24), ValueError, "dense NHWC"),
        (_aspec((1, 2, 2, 4), ptr=(1 << 20) + 8), ValueError, "out: overlaps x"),
    ]
    for spec, exc, match in cases:
        with pytest.raises(exc, match=match):
            _conv.check_out(spec, (1, 2, 2, 4), 0, {"x": x})
    with pytest.raises(ValueError, match="expected 4 dimensions"):
        _conv._check_int8_device("x", _aspec((4, 4, 4)), 4)


def test_describe_host_array_through_cuda_core():
    pytest.importorskip("cuda.core", reason="needs cuda-core installed (make test installs it)")
    a = np.zeros((2, 3, 4, 8), np.int8)[:, :, :, :5]
    spec = _device.describe("x", a, -1)
    assert spec.ptr == a.ctypes.data and spec.shape == a.shape and spec.strides == (96, 32, 8, 1)
    assert spec.device == -1 and spec.dtype == np.int8 and not spec.dense
    assert _device.pixel_pitch("x", spec) == 8
    with pytest.raises(ValueError, match="got host memory"):
        _conv._check_int8_device("x", spec, 4)
    with pytest.raises(TypeError, match="x: cannot view int"):
        _device.describe("x", 3, -1)


def test_dlpack_capsule_round_trip_on_host():
    # The capsule code is the one DeviceArray uses for CUDA memory; on the host NumPy can import it.
    class Export:
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, **kwargs):
            return _dlpack.int8_capsule(self, self.a.ctypes.data, self.a.shape,
                                        [s // self.a.itemsize for s in self.a.strides],
                                        _dlpack.KDL_CPU, 0)

        def __dlpack_device__(self):
            return (_dlpack.KDL_CPU, 0)

    a = np.arange(120, dtype=np.int8).reshape(2, 3, 4, 5)
    for view in (a, a[:, ::2, 1:, :3]):
        b = np.from_dlpack(Export(view))
        assert b.shape == view.shape and b.strides == view.strides
        np.testing.assert_array_equal(b, view)
        assert b.ctypes.data == view.ctypes.data
    e = Export(a)
    before = sys.getrefcount(e)
    cap = e.__dlpack__()
    assert sys.getrefcount(e) == before + 1
    del cap                                       # never consumed: the capsule frees it
    assert sys.getrefcount(e) == before


def test_device_array_exports_cai_v3():
    class Buf:
        handle = 1 << 30

    class Stream:
        handle = 0
        synced = 0

        def sync(self):
            Stream.synced += 1

    y = _device.DeviceArray(Buf(), (2, 3, 4, 5), 0, Stream())
    cai = y.__cuda_array_interface__
    assert cai == {"shape": (2, 3, 4, 5), "typestr": "|i1", "data": (1 << 30, False),
                   "version": 3, "strides": None, "stream": 1}
    assert y.__dlpack_device__() == (_dlpack.KDL_CUDA, 0) and y.strides == (60, 20, 5, 1)
    with pytest.raises(BufferError):
        y.__dlpack__(dl_device=(_dlpack.KDL_CPU, 0))
    with pytest.raises(BufferError):
        y.__dlpack__(copy=True)
    y.__dlpack__(stream=7)                        # another consumer stream waits for ours
    assert Stream.synced == 1
