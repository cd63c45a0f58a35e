"""The roofline probes, the benchmark's command line and scripts."""

import functools
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import qkern
from bench_support import BENCHMARKS, load_benchmark, runtimes_module
from process_support import asan_loaded
from qkern import _roofline, bench, roofline, timing
from qkern._dtypes import bfloat16


def test_peak_loops_match_the_build_and_cap():
    loops = _roofline.peak_loops()
    names = [name for name, _, _ in loops]
    assert len(set(names)) == len(names)
    built = {k.isa for k in qkern.kernels()}
    for name, isa, flops in loops:
        assert qkern.ISA_LEVELS[isa] in built, name
        assert flops > 0


def test_peak_rates_are_positive_and_finite():
    runnable = roofline._runnable_loops()
    if qkern.dispatch.ISA_CAP == "ref":
        assert runnable == []           # every peak loop is SIMD code
        pytest.skip("QKERN_ISA=ref: no peak loop runs under this cap")
    assert runnable, "no peak loop runs here"
    for index, name, _ in runnable:
        rates = roofline.peak_gflops(index, threads=1, seconds=0.01, reps=2)
        assert len(rates) == 2 and all(np.isfinite(r) and r > 0 for r in rates), name


def test_peak_calibration_outlasts_a_slow_first_run(monkeypatch):
    """A first run slowed down (another process on the core) must not stop
    the iteration count from growing: every timed run lasts seconds / 4."""
    calls = []

    def peak_run(index, iters, threads):
        calls.append(iters)
        return 1.0 if len(calls) == 1 else iters * 1e-9  # 1 GHz of iterations

    monkeypatch.setattr(roofline._roofline, "peak_run", peak_run)
    rates = roofline.peak_gflops(0, threads=1, seconds=0.1, reps=3)
    assert all(iters * 1e-9 >= 0.1 / 4 for iters in calls[-3:]), calls
    flops = _roofline.peak_loops()[0][2]
    assert rates == pytest.approx([flops] * 3)


def test_read_bandwidth_small_buffer():
    threads = min(2, len(os.sched_getaffinity(0)))
    rates = roofline.read_bandwidth(threads=threads, nbytes=8 << 20, reps=2)
    assert len(rates) == 2 and all(np.isfinite(r) and r > 0 for r in rates)


def test_measurements_refuse_threads_that_cannot_run():
    """A figure for n threads must come from n threads: more than the
    processors is refused, not silently capped."""
    too_many = len(os.sched_getaffinity(0)) + 1
    with pytest.raises(ValueError, match=f"threads={too_many}"):
        roofline.read_bandwidth(threads=too_many, nbytes=1 << 20, reps=1)
    with pytest.raises(ValueError, match="threads=0"):
        roofline.peak_gflops(0, threads=0)


def test_read_run_rejects_misaligned_buffers():
    buf = np.zeros(4096 + 64, np.uint8)
    off = 1 if buf.ctypes.data % 64 == 0 else 0
    with pytest.raises(ValueError, match="64-byte aligned"):
        _roofline.read_run(buf[off:off + 4096], 1)
    with pytest.raises(ValueError, match="no such peak loop"):
        _roofline.peak_run(len(_roofline.peak_loops()), 1, 1)


def test_last_level_cache_is_plausible():
    assert (256 << 10) <= roofline.last_level_cache_bytes() <= (4 << 30)


def test_cold_copies_exceed_the_cache(monkeypatch):
    """COLD_FACTOR times the last-level cache, but never more than
    COLD_MEMORY_SHARE of the memory (a VM reporting a 480 MiB cache ran out
    of memory); the header says when the cap binds."""
    peers = load_benchmark("peers")
    llc = roofline.last_level_cache_bytes()
    memory = peers._physical_memory()
    assert peers.cold_bytes() == min(peers.COLD_FACTOR * llc,
                                     int(peers.COLD_MEMORY_SHARE * memory))
    for nbytes in (1 << 20, 16 << 20, llc, 4 * llc):
        copies = peers.copies_for_cold(nbytes)
        assert copies >= 2 and copies * nbytes >= peers.cold_bytes()
        assert copies == 2 or (copies - 1) * nbytes < peers.cold_bytes()
    monkeypatch.setattr(peers, "_physical_memory", lambda: 8 << 30)
    monkeypatch.setattr(roofline, "last_level_cache_bytes", lambda: 480 << 20)
    assert peers.cold_bytes() == 128 << 20  # 1/64 of 8 GiB, not 3 x 480 MiB
    assert "capped at 0.0156 of the 8 GiB memory" in peers.cold_note()
    monkeypatch.setattr(roofline, "last_level_cache_bytes", lambda: 32 << 20)
    assert peers.cold_bytes() == 96 << 20 and "capped" not in peers.cold_note()


def test_roofline_seconds_takes_the_binding_ceiling():
    peers = load_benchmark("peers")
    roof = roofline.Roofline(bandwidth={1: [10.0]},
                             peaks={"vfmadd231ps ymm": {1: [100.0]}, "tdpbf16ps": {1: [1000.0]}})
    ref = qkern.kernels()[0]
    # Memory-bound: 1e6 bytes at 10 GB/s; compute-bound: 2e9 flops at 100 GFLOP/s.
    assert peers._roofline_seconds(roof, ref, "float32", 1, 1000, 1000, 10**6, 1) == \
        pytest.approx(1e-4)
    assert peers._roofline_seconds(roof, ref, "float32", 1000, 1000, 1000, 10**6, 1) == \
        pytest.approx(0.02)
    split = [k for k in qkern.kernels() if k.splits_x]
    if split:  # three bf16 planes per float32 activation: three times the flops
        t = peers._roofline_seconds(roof, split[0], "float32", 1000, 1000, 1000, 10**6, 1)
        assert t == pytest.approx(3 * 2e9 / 1e12)


def test_aligned_twin_is_the_nearest_aligned_shape():
    peers = load_benchmark("peers")
    assert peers.aligned_twin(7, 1000, 4095) == (8, 992, 4096)
    assert peers.aligned_twin(33, 4097, 1023) == (32, 4096, 1024)
    assert peers.aligned_twin(1, 5, 40) == (1, 32, 32)


def _fake_roofline(threads):
    return roofline.Roofline(bandwidth={t: [10.0] for t in threads},
                             peaks={k.bound_by: {t: [100.0] for t in threads}
                                    for k in qkern.kernels()})


def test_odd_shapes_are_timed_beside_their_twins(monkeypatch):
    """Each odd shape's row carries its GFLOP/s over the same peer's on the
    aligned twin, which is timed in the same table."""
    peers = load_benchmark("peers")
    monkeypatch.setitem(peers._PEER_SHAPES, True, [])
    monkeypatch.setitem(peers._ODD_SHAPES, True, [(3, 40, 70)])
    monkeypatch.setattr(peers, "copies_for_cold", lambda nbytes: 2)
    rows = peers.peers_table(1, True, _fake_roofline([1]))
    twin = {(r["name"]): r for r in rows if (r["M"], r["N"], r["K"]) == (4, 32, 64)}
    odd = [r for r in rows if (r["M"], r["N"], r["K"]) == (3, 40, 70)]
    assert odd and set(twin) == {r["name"] for r in odd}
    for r in odd:
        assert r["vs_aligned_twin"] == pytest.approx(r["gflops"] / twin[r["name"]]["gflops"])
    assert all("vs_aligned_twin" not in r for r in twin.values())


@pytest.fixture
def small_bench(monkeypatch):
    """Both benchmarks on small problems, short timings and a made-up
    roofline; benchmarks/ on sys.path for woq_bench.py's imports; torch
    left out."""
    monkeypatch.setattr(roofline, "measure", _fake_roofline)
    monkeypatch.setitem(bench._KERNELS_NK, True, 64)
    fast = functools.partial(timing.time_call, warmup=1, budget=0, min_reps=1)
    monkeypatch.setattr(bench, "time_call", fast)
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    woq_bench = load_benchmark("woq_bench")
    peers = woq_bench.peers
    monkeypatch.setattr(peers, "time_call", fast)
    monkeypatch.setattr(woq_bench.int4_peers, "time_call", fast)
    monkeypatch.setitem(peers._PEER_SHAPES, True, [(48, 64)])
    monkeypatch.setattr(peers, "copies_for_cold", lambda nbytes: 2)
    monkeypatch.setattr(peers, "load_torch", lambda: (None, "left out by the test"))
    yield woq_bench
    for name in ("woq_bench", "peers", "int4_peers", "mlp", "plot"):
        sys.modules.pop(name, None)


def test_qkern_bench_prints_the_roofline_and_kernels(small_bench, tmp_path, capsys):
    """python -m qkern bench: the header, the roofline and Table 1, nothing else."""
    from qkern.__main__ import main

    assert main(["bench", "--quick", "--threads", "1", "--json", str(tmp_path / "b.json")]) == 0
    out = capsys.readouterr().out
    assert "Roofline measured in this run" in out and "Table 1 - kernels" in out
    assert "Table 2" not in out and "torch" not in out
    rows = json.loads((tmp_path / "b.json").read_text())["rows"]
    available = {k.name for k in qkern.kernels() if k.available}
    assert {r["table"] for r in rows} == {"kernels"} and {r["name"] for r in rows} == available


def test_full_benchmark_prints_the_kernels_then_the_peers(small_bench, tmp_path, capsys):
    """benchmarks/woq_bench.py: what python -m qkern bench prints, then a
    peers table and an int4 table per thread count, every row in the JSON."""
    path = tmp_path / "b.json"
    assert small_bench.main(["--quick", "--threads", "1,1", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "torch: left out by the test" in out and "Weights cold" in out
    assert out.index("Table 1 - kernels") < out.index("Table 2 - peers") < \
        out.index("Table 4 - int4") and out.count("Table 2 - peers, 1 thread(s)") == 2 and \
        out.count("Table 4 - int4 (groups of 128), 1 thread(s)") == 2
    rows = json.loads(path.read_text())["rows"]
    assert f"wrote {len(rows)} rows to {path}" in out
    peers = [r for r in rows if r["table"] == "peers"]
    assert {r["table"] for r in rows} == {"kernels", "peers", "int4"}
    int4 = [r for r in rows if r["table"] == "int4"]
    assert {(r["M"], r["N"], r["K"]) for r in int4} == {(m, 48, 64) for m in (1, 16, 128)}
    expected4 = {"qkern int4 bfloat16", "qkern int4 float32", "qkern int8 bfloat16",
                 "qkern int8 float32"}
    runtimes = runtimes_module().available()
    if runtimes["openvino"]:
        expected4.add("openvino u4 MatMul f32")
    if runtimes["onnxruntime"]:
        expected4 |= {"onnxruntime MatMulNBits4 acc0", "onnxruntime MatMulNBits4 acc4 (int8 x)"}
    assert {r["name"] for r in int4} == expected4
    assert all(r["ratio_vs_int8"] > 0 for r in int4 if r["name"].startswith("qkern int4"))
    assert {(r["M"], r["N"], r["K"]) for r in peers} == {(m, 48, 64) for m in (1, 16, 128)}
    expected = {"qkern bfloat16", "qkern float16", "qkern float32", "qkern.weight_int8pack_mm",
                "numpy f32 dequant+matmul"}
    if runtimes["openvino"]:
        expected.add("openvino int8 MatMul f32")
    if runtimes["onnxruntime"]:
        expected |= {"onnxruntime MatMulNBits8 acc0", "onnxruntime MatMulNBits8 acc4 (int8 x)"}
    assert {r["name"] for r in peers} == expected


def test_plot_draws_a_png(tmp_path):
    """benchmarks/plot.py draws the peers rows of shapes timed at several M."""
    pytest.importorskip("matplotlib")
    rows = [{"table": "peers", "name": name, "threads": 1, "M": m, "N": 64, "K": 32,
             "pct_roofline": 50.0, "ratio_vs_qkern": 2.0}
            for name in ("qkern bfloat16", "numpy f32 dequant+matmul") for m in (1, 16)]
    load_benchmark("plot").draw(rows, tmp_path / "bench.png")
    assert (tmp_path / "bench.png").read_bytes().startswith(b"\x89PNG")


QKERN = [sys.executable, "-m", "qkern"]
WOQ_BENCH = [sys.executable, str(BENCHMARKS / "woq_bench.py")]


@pytest.mark.parametrize("command, args, message", [
    (QKERN, ["bench", "--threads", "0"], "expected a positive integer"),
    (QKERN, ["bench", "--threads", "1,x"], "expected a positive integer"),
    (QKERN, ["bench", "--json", "/nonexistent-dir/x.json"], "does not exist"),
    (QKERN, ["bench", "--torch"], "unrecognized arguments"),    # benchmarks/woq_bench.py's
    (QKERN, ["frobnicate"], "invalid choice"),
    (WOQ_BENCH, ["--threads", "0"], "expected a positive integer"),
    (WOQ_BENCH, ["--json", "/nonexistent-dir/x.json"], "does not exist"),
    (WOQ_BENCH, ["--plot", "/"], "is a folder"),
])
def test_cli_rejects_bad_arguments(command, args, message):
    r = subprocess.run([*command, *args], capture_output=True, text=True)
    assert r.returncode == 2 and message in r.stderr


def test_cli_info_lists_every_kernel():
    r = subprocess.run([sys.executable, "-m", "qkern", "info"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = {line.split()[0]: line.split() for line in r.stdout.splitlines() if line.strip()}
    for k in qkern.kernels():
        row = lines[k.name]
        assert row[1:4] == [k.isa, k.kind, f"{k.mr}x{k.nr}x{k.kr}"], row
        assert k.bound_by in " ".join(row) and row[-1] == ("yes" if k.available else "no"), row
        assert ("flushes-subnormals" in " ".join(row)) == k.flushes_subnormals, row
        assert ("sums-bytes" in " ".join(row)) == k.sums_bytes, row


def test_minof_script_times_each_row_and_thread_count(capsys):
    """benchmarks/woq_minof.py: one row per (shape, dtype, M, thread count)."""
    minof = load_benchmark("woq_minof")
    minof.main(["64:96:1,33", "--threads", "1,2", "--dtypes", "bfloat16,float32",
                "--reps", "2", "--copies", "2"])
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [(r[2], r[3], r[4], r[7]) for r in rows] == [
        (m, d, "int8", t) for d in ("bfloat16", "float32") for m in ("1", "33")
        for t in ("1", "2")]
    assert all(0 < float(r[8]) <= float(r[9]) for r in rows)


def test_minof_script_times_forced_kernels_side_by_side(capsys):
    """--weights int8:NAME,int4:NAME: each layer runs the kernel it names;
    a name of the wrong weight format or unknown is refused."""
    int8, int4 = (next(k.name for k in qkern.kernels() if k.available and k.weight_format == f
                       and k.kind != "unpacked" and "float32" in k.dtypes)
                  for f in (qkern.dispatch.INT8, qkern.dispatch.INT4))
    minof = load_benchmark("woq_minof")
    minof.main(["64:128:3", "--dtypes", "float32", "--weights", f"int8:{int8},int4:{int4}",
                "--reps", "2", "--copies", "1"])
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [(r[4], r[5], r[6]) for r in rows] == [("int8", "forced", int8),
                                                  ("int4", "forced", int4)]
    with pytest.raises(SystemExit):
        minof.main(["64:128:3", "--weights", "int2:x"])
    with pytest.raises(ValueError, match="int4"):
        minof.main(["64:128:3", "--dtypes", "float32", "--weights", f"int8:{int4}"])


def test_minof_script_times_the_functional_op_beside_the_layer(capsys):
    """--weights int8,int8-functional: the functional op runs the kernel
    dispatch picks for the unpacked weight (or packs), beside the layer."""
    minof = load_benchmark("woq_minof")
    minof.main(["64:96:2,300", "--dtypes", "float32", "--weights", "int8,int8-functional",
                "--reps", "2", "--copies", "2"])
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [(r[2], r[4]) for r in rows] == [(m, form) for m in ("2", "300")
                                            for form in ("int8", "int8-functional")]
    for r in rows[1::2]:
        assert r[5] == qkern.dispatch.choose_kernel(np.float32, int(r[2]),
                                                   unpacked_ok=True, n=64).name
    assert all(0 < float(r[8]) <= float(r[9]) for r in rows)


def test_minof_script_times_the_widened_copy_beside_the_packed_weight(capsys):
    """--weights int8,int8-widened: the widened layer runs a kernel on a
    widened copy and holds its bytes beside the packed weight."""
    isa = qkern.dispatch.choose_kernel(np.float32, 1).isa
    if not any(k.available and k.isa == isa and k.reads_widened_copy for k in qkern.kernels()):
        pytest.skip(f"no kernel of level {isa} reads a widened copy")
    minof = load_benchmark("woq_minof")
    minof.main(["512:512:40", "--dtypes", "float32", "--weights", "int8,int8-widened",
                "--reps", "2", "--copies", "1"])
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [r[4] for r in rows] == ["int8", "int8-widened"]
    assert qkern.dispatch.get_kernel(rows[1][5]).reads_widened_copy
    assert float(rows[0][6]) < 1 <= float(rows[1][6])  # MiB: 0.25 packed, + 1 widened
    assert all(0 < float(r[8]) <= float(r[9]) for r in rows)


def test_minof_script_times_dense_torch_beside_the_layer(capsys):
    """--weights int8,dense-torch: torch.mm on the int8 values as a dense
    weight, in the row's dtype, timed beside the layer; the product is
    x @ w.T, x handed over on its own memory, PyTorch's thread count set."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    minof = load_benchmark("woq_minof")
    try:
        minof.main(["1024:1024:8", "--dtypes", "bfloat16,float32",
                    "--weights", "int8,dense-torch", "--reps", "2", "--copies", "1"])
        rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
        assert [(r[3], r[4], r[5]) for r in rows[1::2]] == [
            ("bfloat16", "dense-torch", "torch.mm"), ("float32", "dense-torch", "torch.mm")]
        assert all(0 < float(r[8]) <= float(r[9]) for r in rows)
        rng = np.random.default_rng(5)
        w = rng.integers(-128, 128, (40, 96), dtype=np.int8)
        for dtype in (bfloat16, np.float16, np.float32):
            dense = minof._TorchDense(w, dtype)
            x = rng.integers(-4, 5, (3, 96)).astype(dtype)
            assert dense.to_torch(x).data_ptr() == x.ctypes.data
            dense.set_threads(1)
            assert torch.get_num_threads() == 1
            got = dense(x, num_threads=1)
            assert got.dtype == getattr(torch, np.dtype(dtype).name)
            # integer sums below 2^24 are exact in f32: the product rounds once, to x's dtype
            exact = x.astype(np.float32) @ w.T.astype(np.float32)
            want = exact.astype(dtype).astype(np.float32)
            np.testing.assert_array_equal(got.float().numpy(), want)
    finally:
        torch.set_num_threads(threads)


def test_runtime_peers_run_the_same_problem():
    """benchmarks/runtimes.py: OpenVINO keeps the weight in int8 and each
    installed runtime computes qkern's problem (K not a multiple of ORT's
    block included); skipped, with the reason, where none is installed."""
    if asan_loaded():
        pytest.skip("OpenVINO loads its libraries with RTLD_DEEPBIND, which AddressSanitizer "
                    "refuses by ending the process")
    runtimes = runtimes_module()
    installed = {name for name, version in runtimes.available().items() if version}
    if not installed:
        pytest.skip("neither OpenVINO nor ONNX Runtime is installed (pip install qkern[bench])")
    rng = np.random.default_rng(3)
    w = rng.integers(-128, 128, (40, 300), dtype=np.int8)
    s = rng.uniform(0.001, 0.01, 40).astype(np.float32)
    x = rng.standard_normal((3, 300)).astype(np.float32)
    want = x.astype(np.float64) @ (w * s.astype(np.float64)[:, None]).T
    runs = []
    if "openvino" in installed:
        runs.append((runtimes.openvino_peer(w, s, 1, 2), 1e-5))
        assert runtimes.weight_precision(runtimes._openvino_model(w, s, 1)) == "i8"
    if "onnxruntime" in installed:
        runs += [(runtimes.onnxruntime_peer(w, s, 1, 2, 0), 1e-5),
                 (runtimes.onnxruntime_peer(w, s, 1, 2, 4), 2e-2)]
    for run, limit in runs:
        for _ in range(2):  # both copies
            got = np.asarray(run(x), np.float64)
            assert np.abs(got - want).max() <= limit * np.abs(want).max()
    # the int4 peers: W = (q - zero point) * scale per group of 64 (an odd count of groups)
    q = rng.integers(0, 16, (40, 5, 64)).astype(np.uint8)
    zp = rng.integers(0, 16, (40, 5)).astype(np.uint8)
    s4 = rng.uniform(0.001, 0.01, (40, 5)).astype(np.float32)
    x4 = rng.standard_normal((3, 320)).astype(np.float32)
    want = x4.astype(np.float64) @ ((q - zp[..., None].astype(np.float64))
                                    * s4[..., None]).reshape(40, 320).T
    runs = []
    if "openvino" in installed:
        runs.append((runtimes.openvino_int4_peer(q, zp, s4, 1, 2), 1e-5))
    if "onnxruntime" in installed:
        runs += [(runtimes.onnxruntime_int4_peer(q, zp, s4, 1, 2, 0), 1e-5),
                 (runtimes.onnxruntime_int4_peer(q, zp, s4, 1, 2, 4), 2e-2)]
    for run, limit in runs:
        for _ in range(2):
            got = np.asarray(run(x4), np.float64)
            assert np.abs(got - want).max() <= limit * np.abs(want).max()


def test_a_peer_that_computes_another_problem_is_refused(monkeypatch):
    peers = load_benchmark("peers")
    monkeypatch.setattr(peers, "copies_for_cold", lambda nbytes: 2)
    monkeypatch.setattr(peers.runtimes, "openvino_peer",
                        lambda w, s, threads, copies: lambda x: np.zeros((len(x), len(w))))
    prob = peers._Problem(np.random.default_rng(0), 40, 64, 4, None)
    with pytest.raises(RuntimeError, match="openvino.*not the same problem"):
        prob.calls(3, 1, False)
    int4_peers = load_benchmark("int4_peers")
    monkeypatch.setattr(int4_peers.peers, "copies_for_cold", lambda nbytes: 2)
    monkeypatch.setattr(int4_peers.runtimes, "onnxruntime_int4_peer",
                        lambda q, zp, s, threads, copies, level: lambda x: np.ones(
                            (len(x), len(q)), np.float32))
    prob4 = int4_peers._Int4Problem(np.random.default_rng(0), 40, 64, 4, None)
    with pytest.raises(RuntimeError, match="onnxruntime.*not the same problem"):
        prob4.calls(3, 1)
