"""The public WoQ API: semantics over shapes/dtypes/values, out=, pickling,
errors, NaN/Inf, determinism and thread safety.  Kernel choice is automatic
here (so the per-ISA CI runs exercise every ISA's automatic path)."""

import copyreg
import pickle
import threading

import ml_dtypes
import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import qkern
from conftest import woq_bound_traits
from process_support import run_python
from qkern.dispatch import INT8
from qkern.packing import PackedWeight
from reference import BF16, DTYPES, assert_woq_close, first_dtype, woq_reference

DTYPE_IDS = [d.name for d in DTYPES]


def _values(rng, shape, dtype, magnitude):
    """Normal values scaled by 2**magnitude, signs mixed, with edge values sprinkled."""
    v = rng.standard_normal(shape) * 2.0**magnitude
    return v.astype(dtype)


@given(
    m=st.integers(0, 40), n=st.integers(0, 70), k=st.integers(0, 300),
    dtype=st.sampled_from(DTYPES), magnitude=st.integers(-30, 20),
    w_kind=st.sampled_from(["uniform", "extremes", "small"]),
    with_bias=st.booleans(), functional=st.booleans(), seed=st.integers(0, 2**32 - 1),
)
@example(m=1, n=1, k=1, dtype=BF16, magnitude=0, w_kind="extremes", with_bias=True,
         functional=True, seed=0)
@example(m=1, n=1, k=0, dtype=np.dtype(np.float16), magnitude=0, w_kind="uniform",
         with_bias=True, functional=False, seed=0)
@example(m=33, n=65, k=257, dtype=np.dtype(np.float32), magnitude=10, w_kind="extremes",
         with_bias=False, functional=True, seed=1)
@example(m=2, n=3, k=64, dtype=np.dtype(np.float16), magnitude=-20, w_kind="uniform",
         with_bias=False, functional=False, seed=2)  # subnormal fp16 activations
@example(m=2, n=3, k=64, dtype=BF16, magnitude=-130, w_kind="uniform",
         with_bias=False, functional=False, seed=3)  # subnormal bf16 activations
def test_matches_reference(m, n, k, dtype, magnitude, w_kind, with_bias, functional, seed):
    rng = np.random.default_rng(seed)
    if dtype == np.float16:
        magnitude = max(min(magnitude, 4), -24)
    x = _values(rng, (m, k), dtype, magnitude)
    if w_kind == "extremes":
        w = rng.choice(np.array([-128, 127, -1, 0, 1], dtype=np.int8), size=(n, k))
    elif w_kind == "small":
        w = rng.integers(-2, 3, size=(n, k), dtype=np.int8)
    else:
        w = rng.integers(-128, 128, size=(n, k), dtype=np.int8)
    s = rng.uniform(2.0**-12, 2.0**-4, n).astype(dtype)
    b = rng.standard_normal(n).astype(dtype) if with_bias else None
    if functional:
        y = qkern.weight_int8pack_mm(x, w, s, bias=b)
    else:
        y = qkern.WoqLinear(w, s, b)(x)
    assert y.shape == (m, n) and y.dtype == dtype
    assert_woq_close(y, x, w, s, b, **woq_bound_traits(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_batch_dims_and_large_m(dtype):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 5, 48)).astype(dtype)
    w = rng.integers(-128, 128, (20, 48), dtype=np.int8)
    s = rng.uniform(0.01, 0.02, 20).astype(dtype)
    y = qkern.weight_int8pack_mm(x, w, s)
    assert y.shape == (2, 3, 5, 20)
    assert_woq_close(y.reshape(-1, 20), x.reshape(-1, 48), w, s, **woq_bound_traits(dtype))
    big = rng.standard_normal((100_000, 8)).astype(dtype)
    w = rng.integers(-128, 128, (3, 8), dtype=np.int8)
    s = np.ones(3, dtype=dtype)
    y = qkern.WoqLinear(w, s)(big)
    assert y.shape == (100_000, 3)
    assert_woq_close(y, big, w, s, **woq_bound_traits(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_1d_x_and_empty(dtype):
    w = np.array([[1, -2, 3]], dtype=np.int8)
    s = np.array([2], dtype=dtype)
    y = qkern.weight_int8pack_mm(np.array([1, 1, 1], dtype=dtype), w, s)
    assert y.shape == (1,) and float(y[0]) == 4.0
    assert qkern.weight_int8pack_mm(np.zeros((0, 3), dtype), w, s).shape == (0, 1)
    w0 = np.zeros((0, 3), dtype=np.int8)
    assert qkern.weight_int8pack_mm(np.ones((4, 3), dtype), w0, np.zeros(0, dtype)).shape == (4, 0)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_nan_inf_propagate(dtype):
    w = np.array([[1, 0], [0, 1], [2, 2], [0, 0]], dtype=np.int8)
    s = np.ones(4, dtype=dtype)
    x = np.array([[np.inf, 1.0], [np.nan, 1.0], [-np.inf, 2.0], [np.inf, -np.inf]], dtype=dtype)
    y = qkern.WoqLinear(w, s)(x).astype(np.float64)
    # inf*0 = NaN, NaN spreads, inf - inf = NaN (IEEE 754).
    expect = np.array([[np.inf, np.nan, np.inf, np.nan],
                       [np.nan, np.nan, np.nan, np.nan],
                       [-np.inf, np.nan, -np.inf, np.nan],
                       [np.nan, np.nan, np.nan, np.nan]])
    np.testing.assert_array_equal(y, expect)


def test_overflow_to_inf_in_output_dtype():
    x = np.full((1, 4), 60000.0, dtype=np.float16)
    w = np.full((2, 4), 127, dtype=np.int8)
    w[1] = -127
    y = qkern.WoqLinear(w, np.ones(2, np.float16))(x)
    np.testing.assert_array_equal(y, np.array([[np.inf, -np.inf]], dtype=np.float16))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_out_argument(dtype):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((7, 33)).astype(dtype)
    w = rng.integers(-128, 128, (9, 33), dtype=np.int8)
    s = rng.uniform(0.01, 0.02, 9).astype(dtype)
    b = rng.standard_normal(9).astype(dtype)
    expect = qkern.weight_int8pack_mm(x, w, s, bias=b)
    out = np.full((7, 9), np.nan, dtype=dtype)
    assert qkern.weight_int8pack_mm(x, w, s, bias=b, out=out) is out
    assert np.array_equal(out.view(np.uint8), expect.view(np.uint8))
    layer = qkern.WoqLinear(w, s, b)
    out2 = np.full((7, 9), np.nan, dtype=dtype)
    assert layer(x, out=out2) is out2
    assert_woq_close(out2, x, w, s, b, **woq_bound_traits(dtype))


def test_empty_out_with_any_strides():
    # NumPy views of empty torch tensors have all-zero strides.
    x, w, s = np.ones((0, 3), np.float32), np.ones((2, 3), np.int8), np.ones(2, np.float32)
    out = np.lib.stride_tricks.as_strided(np.empty(1, np.float32), (0, 2), (0, 0))
    assert qkern.weight_int8pack_mm(x, w, s, out=out) is out


def test_woqlinear_pickle_nbytes_weight_roundtrip():
    rng = np.random.default_rng(7)
    w = rng.integers(-128, 128, (45, 77), dtype=np.int8)
    s = rng.uniform(0.01, 0.02, 45).astype(BF16)
    b = rng.standard_normal(45).astype(BF16)
    layer = qkern.WoqLinear(w, s, b)
    assert np.array_equal(layer.weight(), w)
    assert np.array_equal(layer.scales, s) and np.array_equal(layer.bias, b)
    for view in (layer.scales, layer.bias, layer.packed_weight.data):
        assert not view.flags.writeable
        with pytest.raises(ValueError, match="WRITEABLE"):  # nor can it be made so
            view.flags.writeable = True
    assert qkern.WoqLinear(w, s).bias is None
    nr, kr = layer.layout
    packed = 45 // nr * nr * (-(-77 // kr) * kr) + 45 % nr * 77  # a partial panel as rows
    assert packed <= layer.nbytes < packed + 45 * 2 * 2 + 2 * 4 * (45 + nr)
    clone = pickle.loads(pickle.dumps(layer))
    x = rng.standard_normal((5, 77)).astype(BF16)
    assert np.array_equal(clone(x).view(np.uint16), layer(x).view(np.uint16))
    assert np.array_equal(clone.weight(), w)
    assert "N=45" in repr(layer)


@pytest.mark.parametrize("shape", [(3, 0), (0, 5), (0, 0)])
def test_woqlinear_empty_weight_unpacks_and_pickles(shape):
    """Regression (found by fuzzing): weight() and pickling raised ValueError
    for K = 0 (an ambiguous reshape of the empty packed buffer)."""
    w = np.zeros(shape, np.int8)
    layer = qkern.WoqLinear(w, np.ones(shape[0], np.float32))
    assert layer.weight().shape == shape
    clone = pickle.loads(pickle.dumps(layer))
    assert clone.shape == shape
    y = clone(np.ones((2, shape[1]), np.float32))
    assert y.shape == (2, shape[0]) and (y == 0).all()


def test_empty_out_any_strides():
    """An out with no elements is never written, so its strides do not matter
    (as for NumPy, which calls every empty array contiguous).  Regression
    (found by fuzzing): one with rows not one stride apart was refused."""
    x = np.ones((0, 4, 3, 5), np.float32)
    w = np.ones((2, 5), np.int8)
    out = np.lib.stride_tricks.as_strided(np.ones(1, np.float32), (0, 4, 3, 2), (-168, 8, 40, 4))
    assert qkern.weight_int8pack_mm(x, w, np.ones(2, np.float32), out=out) is out


def test_woqlinear_keeps_one_packed_copy_and_not_callers_weight():
    w = np.ones((64, 64), dtype=np.int8)
    layer = qkern.WoqLinear(w, np.ones(64, np.float32))
    w[:] = 0  # mutating the caller's array must not change the layer
    assert float(layer(np.ones(64, np.float32))[0]) == 64.0
    held = list(vars(layer).values())
    assert [v for v in held if isinstance(v, PackedWeight)] == [layer.packed_weight]
    assert not [v for v in held if isinstance(v, np.ndarray) and v.dtype == np.int8]


@pytest.mark.parametrize("n", [1, 2, 15, 17, 31, 33])
@pytest.mark.parametrize("k", [1, 7, 300])
def test_small_n_is_not_padded_to_a_panel(n, k):
    """A partial last panel is held as plain rows: N = 1 cost a whole panel
    (16 or 32 times the weight) in the layer and on every functional call."""
    rng = np.random.default_rng(n * k)
    w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    s = rng.uniform(0.5, 2, n).astype(np.float32)
    for kern in (k for k in qkern.kernels() if k.available and k.weight_format == INT8):
        nr, kr = kern.layout
        packed = PackedWeight(w, kern.layout)
        rows_padded_to_kr = n * (-(-k // max(kr, 1)) * max(kr, 1))
        assert packed.nbytes <= rows_padded_to_kr, kern.name
        if k >= 4:  # kr <= 2
            assert packed.nbytes <= 1.25 * n * k, kern.name
        dtype = first_dtype(kern)
        layer = qkern.WoqLinear(w, s.astype(dtype), kernel=kern.name)
        assert layer.packed_weight.nbytes == packed.nbytes
        scales_bytes = n * dtype.itemsize + 4 * -(-n // nr) * nr  # and as float32, in panels
        assert layer.nbytes <= rows_padded_to_kr + scales_bytes, (kern.name, layer.nbytes)
        assert np.array_equal(layer.weight(), w) and layer.weight().flags.c_contiguous
        x = rng.standard_normal((5, k)).astype(dtype)
        assert_woq_close(layer(x), x, w, s.astype(dtype), daz=kern.flushes_subnormals,
                         planes=kern.planes(dtype))
        clone = pickle.loads(pickle.dumps(layer))  # Regression (found by fuzzing): weight()
        assert clone(x).tobytes() == layer(x).tobytes()  # came out F-ordered for N = nr + 1


def _state(layer) -> dict:
    return dict(layer.__getstate__())


@pytest.mark.parametrize("fault, exc", [
    (lambda st: st.update(weight=st["weight"].unpack()[:, :-1]), ValueError),  # a strided view
    (lambda st: st.update(scales=st["scales"][:-1]), ValueError),  # N of scales differs
    (lambda st: st.update(bias=np.ones(3, np.float32)), ValueError),
    (lambda st: st.update(weight=st["weight"].unpack().astype(np.int16)), TypeError),
    (lambda st: st.update(weight=np.asfortranarray(st["weight"].unpack())), ValueError),
    (lambda st: st.update(scales=st["scales"].astype(np.float64)), TypeError),
    (lambda st: st.update(weight=b"\x00" * 4096), TypeError),
    (lambda st: st.pop("scales"), TypeError),
    (lambda st: st.update(packed=np.zeros(8, np.int8)), TypeError),
])
def test_crafted_state_is_refused(fault, exc):
    """Regression: a layer rebuilt with object.__new__ and a state whose
    shape, weight or vectors did not agree read out of bounds on its first
    call.  Every part of a state is checked as the constructor's arguments
    are, before anything is packed."""
    layer = qkern.WoqLinear(np.ones((40, 24), np.int8), np.ones(40, np.float32),
                            np.zeros(40, np.float32))
    state = _state(layer)
    fault(state)
    crafted = object.__new__(qkern.WoqLinear)
    with pytest.raises(exc):
        crafted.__setstate__(state)
    good = object.__new__(qkern.WoqLinear)
    good.__setstate__(_state(layer))
    x = np.ones((2, 24), np.float32)
    assert good(x).tobytes() == layer(x).tobytes()


def test_crafted_pickle_is_refused():
    """The same through pickle: its BUILD step calls __setstate__."""
    class Forged:  # pickles as a WoqLinear with a state whose N disagrees
        def __reduce__(self):
            return (copyreg._reconstructor, (qkern.WoqLinear, object, None),
                    {"weight": np.ones((64, 8), np.int8), "scales": np.ones(4, np.float32),
                     "bias": None, "kernel": None})

    with pytest.raises(ValueError, match="scales"):
        pickle.loads(pickle.dumps(Forged()))


def test_tampered_layer_attributes_refused_before_c():
    """Attributes changed behind the layer's back (the packed weight's shape
    or bytes, the padded scales, a forced kernel of another layout) are
    caught before the C driver reads them: a ValueError, never a crash or a
    wrong result (in a process of its own, in case)."""
    proc = run_python("""
        import copy
        import numpy as np, qkern
        layer = qkern.WoqLinear(np.ones((64, 256), np.int8), np.ones(64, np.float32))
        x = np.ones((3, 256), np.float32)
        taller, shorter = copy.copy(layer.packed_weight), copy.copy(layer.packed_weight)
        taller._shape = (4096, 256)
        shorter._data = shorter._data[:100]
        other = next(k for k in qkern.kernels() if k.available and k.kind == "panels"
                     and k.weight_format == "int8_per_channel" and k.layout != layer.layout)
        for name, value in [("_weight", taller), ("_weight", shorter),
                            ("_scale_f32", layer._scale_f32[:8]), ("_forced", other)]:
            tampered = object.__new__(qkern.WoqLinear)
            tampered.__dict__.update(vars(layer), **{name: value})
            try:
                tampered(np.ones((3, tampered.shape[1]), np.float32))
            except ValueError as e:
                print(name, "refused:", e)
            else:
                raise SystemExit(f"tampered {name} was not refused")
        """)
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout.count("refused") == 4, proc.stdout


def _packed_by_numpy(w, nr: int, kr: int) -> np.ndarray:
    """The layout drawn in include/qkern/woq.h: whole panels of nr rows, each
    k-group of kr bytes of its nr rows in turn, the last k-group zero-padded;
    then the rows past the whole panels as they are."""
    n, k = w.shape
    g = kr or max(k, 1)
    whole, groups = n // nr * nr, -(-k // g)
    padded = np.zeros((whole, groups * g), np.int8)
    padded[:, :k] = w[:whole]
    panels = padded.reshape(whole // nr, nr, groups, g).transpose(0, 2, 1, 3)
    return np.concatenate([panels.reshape(-1), w[whole:].reshape(-1)])


@pytest.mark.parametrize("layout", sorted({k.layout for k in qkern.kernels()
                                            if k.weight_format == INT8}))
def test_packed_weight_packs_unpacks_and_reports_its_size(layout):
    """PackedWeight packs and unpacks in C, for every layout of the registry
    and shapes around its panel and k-group (a partial panel, K = 0), and
    K past whole blocks of 16 bytes a row (packed by transposes, the rest
    byte by byte): bytes as documented, padding zeroed."""
    rng = np.random.default_rng(13)
    nr, kr = layout
    for n, k in [(1, 1), (nr - 1 or 1, 7), (nr, kr or 5), (nr + 1, 2 * max(kr, 1) + 1),
                 (3 * nr + 2, 64), (2 * nr, 53), (5, 0), (0, 5)]:
        w = rng.integers(-128, 128, (n, k), dtype=np.int8)
        p = PackedWeight(w, layout)
        assert (p.shape, p.layout, p.format) == ((n, k), layout, "int8_per_channel")
        assert p.nbytes == p.data.nbytes == qkern._woq.packed_size(n, k, nr, kr)
        assert (p.nbytes == 0 or p.data.ctypes.data % 64 == 0) and not p.data.flags.writeable
        u = p.unpack()
        assert u.flags.c_contiguous and np.array_equal(u, w)
        dirty = np.full(p.nbytes, 0x55, np.int8)  # padding must be written, not left
        qkern._woq.pack(w, nr, kr, dirty)
        assert np.array_equal(dirty, p.data) and np.array_equal(p.data, _packed_by_numpy(w, nr, kr))
        clone = pickle.loads(pickle.dumps(p))
        assert clone.data.tobytes() == p.data.tobytes() and np.array_equal(clone.unpack(), w)
        other = (16, 1) if layout != (16, 1) else (32, 2)
        assert p.repacked(layout) is p
        assert np.array_equal(p.repacked(other).unpack(), w)


@pytest.mark.parametrize("fault, exc", [
    (lambda st: st.update(data=st["data"][:-1]), ValueError),
    (lambda st: st.update(shape=(st["shape"][0] + 1, st["shape"][1])), ValueError),
    (lambda st: st.update(shape=(-1, 3)), ValueError),
    (lambda st: st.update(shape=(2**62, 4), data=b""), ValueError),  # its size wraps around
    (lambda st: st.update(shape=(2**64, 1)), ValueError),
    (lambda st: st.update(layout=(8, 1)), ValueError),
    (lambda st: st.update(format="int4_groupwise"), ValueError),
    (lambda st: st.update(data=list(st["data"])), TypeError),
    (lambda st: st.pop("layout"), TypeError),
])
def test_packed_weight_refuses_a_crafted_state(fault, exc):
    p = PackedWeight(np.ones((20, 9), np.int8), (16, 1))
    state = dict(p.__getstate__())
    fault(state)
    with pytest.raises(exc):
        object.__new__(PackedWeight).__setstate__(state)


def test_packing_refuses_a_layout_of_no_panels():
    with pytest.raises(ValueError, match="nr"):
        qkern._woq.packed_size(1, 1, 0, 1)  # was a division by zero in C
    with pytest.raises(ValueError, match="layout"):
        PackedWeight(np.ones((2, 2), np.int8), (0, 1))


def test_layer_pickles_its_packed_weight_and_takes_one():
    """A layer pickles its packed weight: unpickled on a machine whose
    kernels read the same layout it is not repacked (its bytes are the same
    object's); a layer can also be built from a PackedWeight."""
    rng = np.random.default_rng(14)
    w = rng.integers(-128, 128, (40, 24), dtype=np.int8)
    s = np.ones(40, np.float32)
    layer = qkern.WoqLinear(w, s)
    state = layer.__getstate__()
    assert state["weight"] is layer.packed_weight
    clone = pickle.loads(pickle.dumps(layer))
    assert clone.layout == layer.layout and np.array_equal(clone.weight(), w)
    x = rng.standard_normal((3, 24)).astype(np.float32)
    assert clone(x).tobytes() == layer(x).tobytes()
    given_packed = qkern.WoqLinear(layer.packed_weight, s)
    assert given_packed.packed_weight is layer.packed_weight
    other = (16, 1) if layer.layout != (16, 1) else (32, 2)
    assert qkern.WoqLinear(PackedWeight(w, other), s)(x).tobytes() == layer(x).tobytes()


THREADS = 8


def _calls(seed: int, layer, w, s, b) -> list:
    """Calls to run: ``layer`` on fresh x of batch sizes that pick kernels of
    different MR (300 > 256 rows also splits M), with a different num_threads
    each and out= every other time, then the function on the weight itself."""
    rng = np.random.default_rng(seed)
    n, k = layer.shape
    calls = []
    for i, m in enumerate((1, 5, 17, 64, 300)):
        x = (rng.standard_normal((m, k)) * 4).astype(layer.dtype)
        threads = (None, 1, 2)[i % 3]
        if i % 2:
            out = np.empty((m, n), layer.dtype)
            calls.append(lambda x=x, t=threads, out=out: layer(x, out=out, num_threads=t).copy())
        else:
            calls.append(lambda x=x, t=threads: layer(x, num_threads=t))
    x = rng.standard_normal((9, k)).astype(layer.dtype)
    calls.append(lambda: qkern.weight_int8pack_mm(x, w, s, bias=b))
    return calls


@pytest.mark.parametrize("sharing", ["one_layer", "own_layers", "three_shared", "built_in_threads"])
def test_concurrent_calls_match_serial(sharing):
    """8 Python threads, released together by a barrier, each making its
    calls 10 times: on one shared WoqLinear, on a layer each, on three layers
    (of the three dtypes and other shapes) shared by threads i % 3, or on
    layers each thread builds at the same time as the others.  Every result
    has the bits of the same call made serially beforehand."""
    rng = np.random.default_rng(8)
    shapes = [(DTYPES[i % 3], 24 + 13 * i, 40 + 21 * i) for i in range(THREADS)]
    weights = [(rng.integers(-128, 128, (n, k), dtype=np.int8),
                rng.uniform(0.01, 0.02, n).astype(dtype), rng.standard_normal(n).astype(dtype))
               for dtype, n, k in shapes]
    owner = {"one_layer": [0] * THREADS, "three_shared": [i % 3 for i in range(THREADS)]}.get(
        sharing, list(range(THREADS)))
    layers = {j: qkern.WoqLinear(*weights[j]) for j in set(owner)}
    expect = [[f() for f in _calls(i, layers[j], *weights[j])] for i, j in enumerate(owner)]
    barrier = threading.Barrier(THREADS)
    results, errors = [None] * THREADS, []

    def run(i):
        try:
            j = owner[i]
            barrier.wait()
            layer = qkern.WoqLinear(*weights[j]) if sharing == "built_in_threads" else layers[j]
            calls = _calls(i, layer, *weights[j])
            results[i] = [[f() for f in calls] for _ in range(10)]
        except Exception as e:  # reported below, with the thread's index
            errors.append((i, e))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for i in range(THREADS):
        for rep in results[i]:
            for got, want in zip(rep, expect[i], strict=True):
                assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), (sharing, i)


def test_threadpoolctl_limit_respected_and_results_equal():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    rng = np.random.default_rng(9)
    w = rng.integers(-128, 128, (500, 300), dtype=np.int8)
    layer = qkern.WoqLinear(w, rng.uniform(0.01, 0.02, 500).astype(BF16))
    x = rng.standard_normal((40, 300)).astype(BF16)
    y = layer(x)
    with threadpoolctl.threadpool_limits(limits=1, user_api="openmp"):
        assert np.array_equal(layer(x).view(np.uint16), y.view(np.uint16))


# ---- errors: every bad argument is named, nothing is written ------------------

def _ok():
    x = np.ones((2, 4), np.float32)
    w = np.ones((3, 4), np.int8)
    s = np.ones(3, np.float32)
    return x, w, s


@pytest.mark.parametrize("mutate, exc, match", [
    (lambda x, w, s: (x.astype(np.float64), w, s), TypeError, "x: expected dtype"),
    (lambda x, w, s: (x.astype(np.int8), w, s), TypeError, "x: expected dtype"),
    (lambda x, w, s: (x.tolist(), w, s), TypeError, "x: expected a numpy.ndarray"),
    (lambda x, w, s: (np.array(1.0, np.float32), w, s), ValueError, "x: expected shape"),
    (lambda x, w, s: (np.ones((2, 5), np.float32), w, s), ValueError,
     "x: expected last dimension K=4"),
    (lambda x, w, s: (x, w.astype(np.int16), s), TypeError, "w: expected dtype int8"),
    (lambda x, w, s: (x, w.astype(np.uint8), s), TypeError, "w: expected dtype int8"),
    (lambda x, w, s: (x, np.ones(4, np.int8), s), ValueError, "w: expected 2 dimension"),
    (lambda x, w, s: (x, np.ones((4, 3), np.int8).T, s), ValueError, "w: expected a C-contiguous"),
    (lambda x, w, s: (x, w, s.astype(np.float16)), TypeError, "scales: expected dtype float32"),
    (lambda x, w, s: (x, w, np.ones(2, np.float32)), ValueError, r"scales: expected shape \(3,\)"),
    (lambda x, w, s: (x, w, np.ones((3, 1), np.float32)), ValueError, "scales: expected 1 dim"),
])
def test_bad_arguments(mutate, exc, match):
    x, w, s = mutate(*_ok())
    with pytest.raises(exc, match=match):
        qkern.weight_int8pack_mm(x, w, s)


@pytest.mark.parametrize("kwargs, exc, match", [
    ({"bias": np.ones(3, np.float16)}, TypeError, "bias: expected dtype float32"),
    ({"bias": np.ones(4, np.float32)}, ValueError, "bias: expected shape"),
    ({"out": np.zeros((2, 4), np.float32)}, ValueError, r"out: expected shape \(2, 3\)"),
    ({"out": np.zeros((2, 3), np.float16)}, TypeError, "out: expected dtype float32"),
    ({"out": np.zeros((3, 2), np.float32).T}, ValueError, "out: expected unit stride"),
    ({"out": np.zeros((2, 3), np.float32).tolist()}, TypeError, "out: expected a numpy.ndarray"),
    ({"num_threads": 0}, ValueError, "num_threads: expected 1 to 2147483647"),
    ({"num_threads": 2**31}, ValueError, "num_threads: expected 1 to 2147483647"),
    ({"num_threads": 1.5}, TypeError, "num_threads: expected an int"),
    ({"num_threads": True}, TypeError, "num_threads: expected an int"),
])
def test_bad_keyword_arguments(kwargs, exc, match):
    x, w, s = _ok()
    with pytest.raises(exc, match=match):
        qkern.weight_int8pack_mm(x, w, s, **kwargs)


def test_read_only_and_overlapping_out_rejected_untouched():
    x, w, s = _ok()
    ro = np.full((2, 3), 7.0, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="out: the array is read-only"):
        qkern.weight_int8pack_mm(x, w, s, out=ro)
    buf = np.ones(8, np.float32) * 3
    x_view = buf[:8].reshape(2, 4)
    out_view = buf[:6].reshape(2, 3)
    with pytest.raises(ValueError, match="out: overlaps x"):
        qkern.weight_int8pack_mm(x_view, w, s, out=out_view)
    assert (buf == 3).all()
    sbuf = np.ones(9, np.float32)
    with pytest.raises(ValueError, match="out: overlaps scales"):
        qkern.weight_int8pack_mm(x, w, sbuf[:3], out=sbuf[1:7].reshape(2, 3))
    # Regression (found by fuzzing): rows of out that overlap one another were
    # accepted, and threads wrote different rows to the same bytes.
    obuf = np.full(8, 5.0, np.float32)
    for row_stride in (0, 4, -8):
        out = np.lib.stride_tricks.as_strided(obuf[4:] if row_stride < 0 else obuf, (2, 3),
                                              (row_stride, 4))
        with pytest.raises(ValueError, match="out: rows overlap each other"):
            qkern.weight_int8pack_mm(x, w, s, out=out)
    assert (obuf == 5).all()


def test_woqlinear_bad_arguments():
    w = np.ones((3, 4), np.int8)
    with pytest.raises(TypeError, match="scales: expected dtype float32, float16 or bfloat16"):
        qkern.WoqLinear(w, np.ones(3, np.float64))
    with pytest.raises(ValueError, match="no kernel named"):
        qkern.WoqLinear(w, np.ones(3, np.float32), kernel="nope")
    bf16_only = [k for k in qkern.kernels() if k.available and k.dtypes == ("bfloat16",)]
    if bf16_only:
        with pytest.raises(ValueError, match="does not accept dtype float32"):
            qkern.WoqLinear(w, np.ones(3, np.float32), kernel=bf16_only[0].name)
    layer = qkern.WoqLinear(w, np.ones(3, ml_dtypes.bfloat16))
    with pytest.raises(TypeError, match="x: expected dtype bfloat16"):
        layer(np.ones(4, np.float32))


def test_reference_sanity():
    """The test reference itself, on a hand-computed case."""
    y = woq_reference(np.array([[1.0, 2.0]]), np.array([[3, -1]], np.int8), np.array([0.5]),
                      np.array([1.0]))
    assert y.tolist() == [[1.5]]
