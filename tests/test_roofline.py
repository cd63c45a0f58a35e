"""The roofline probes, the benchmark's command line and scripts."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import qkern
from qkern import _roofline, bench, roofline


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


def test_cold_copies_exceed_the_cache():
    llc = roofline.last_level_cache_bytes()
    for nbytes in (1 << 20, 16 << 20, llc, 4 * llc):
        copies = bench.copies_for_cold(nbytes)
        assert copies >= 2 and copies * nbytes >= 1.5 * llc


def test_roofline_seconds_takes_the_binding_ceiling():
    roof = roofline.Roofline(bandwidth={1: [10.0]},
                             peaks={"vfmadd231ps ymm": {1: [100.0]}, "tdpbf16ps": {1: [1000.0]}})
    ref = qkern.kernels()[0]
    # Memory-bound: 1e6 bytes at 10 GB/s; compute-bound: 2e9 flops at 100 GFLOP/s.
    assert bench._roofline_seconds(roof, ref, "float32", 1, 1000, 1000, 1) == pytest.approx(1e-4)
    assert bench._roofline_seconds(roof, ref, "float32", 1000, 1000, 1000, 1) == pytest.approx(0.02)
    split = [k for k in qkern.kernels() if k.splits_x]
    if split:  # three bf16 planes per float32 activation: three times the flops
        t = bench._roofline_seconds(roof, split[0], "float32", 1000, 1000, 1000, 1)
        assert t == pytest.approx(3 * 2e9 / 1e12)


def test_aligned_twin_is_the_nearest_aligned_shape():
    assert bench.aligned_twin(7, 1000, 4095) == (8, 992, 4096)
    assert bench.aligned_twin(33, 4097, 1023) == (32, 4096, 1024)
    assert bench.aligned_twin(1, 5, 40) == (1, 32, 32)


def test_odd_shapes_are_timed_beside_their_twins(monkeypatch):
    """Each odd shape's row carries its GFLOP/s over the same peer's on the
    aligned twin, which is timed in the same table."""
    monkeypatch.setitem(bench._PEER_SHAPES, True, [])
    monkeypatch.setitem(bench._ODD_SHAPES, True, [(3, 40, 70)])
    monkeypatch.setattr(bench, "copies_for_cold", lambda nbytes: 2)
    roof = roofline.Roofline(bandwidth={1: [10.0]},
                             peaks={k.bound_by: {1: [100.0]} for k in qkern.kernels()})
    rows = bench.peers_table(1, True, roof)
    twin = {(r["name"]): r for r in rows if (r["M"], r["N"], r["K"]) == (4, 32, 64)}
    odd = [r for r in rows if (r["M"], r["N"], r["K"]) == (3, 40, 70)]
    assert odd and set(twin) == {r["name"] for r in odd}
    for r in odd:
        assert r["vs_aligned_twin"] == pytest.approx(r["gflops"] / twin[r["name"]]["gflops"])
    assert all("vs_aligned_twin" not in r for r in twin.values())


@pytest.mark.parametrize("args, message", [
    (["bench", "--threads", "0"], "expected a positive integer"),
    (["bench", "--threads", "1,x"], "expected a positive integer"),
    (["bench", "--json", "/nonexistent-dir/x.json"], "does not exist"),
    (["frobnicate"], "invalid choice"),
])
def test_cli_rejects_bad_arguments(args, message):
    r = subprocess.run([sys.executable, "-m", "qkern", *args], capture_output=True, text=True)
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


def test_minof_script_times_each_row_and_thread_count(capsys):
    """benchmarks/woq_minof.py: one row per (shape, dtype, M, thread count)."""
    spec = importlib.util.spec_from_file_location(
        "woq_minof", Path(__file__).resolve().parent.parent / "benchmarks" / "woq_minof.py")
    minof = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(minof)
    minof.main(["64:96:1,33", "--threads", "1,2", "--dtypes", "bfloat16,float32",
                "--reps", "2", "--copies", "2"])
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [(r[2], r[3], r[5]) for r in rows] == [
        (m, d, t) for d in ("bfloat16", "float32") for m in ("1", "33") for t in ("1", "2")]
    assert all(0 < float(r[6]) <= float(r[7]) for r in rows)
