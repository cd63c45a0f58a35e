"""benchmarks/gpu_check.py as far as a CPU allows: it refuses cleanly
without a GPU, and its report/table code works on recorded data."""

import importlib.util
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)


def test_exits_2_with_a_reason_without_gpu(tmp_path, capsys):
    if gpu_check.gpu_reason() is None:
        pytest.skip("this machine has a GPU path")
    assert gpu_check.main(["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpu_check: no GPU path on this machine, nothing run:")
    assert "qkern[cuda]" in err
    assert not list(tmp_path.iterdir())


def test_table_from_recorded_results():
    tests = {"summary": "7 passed in 80.0s", "seconds": 80.0, "records": [
        {"test": "hypothesis", "elements": 1000, "mismatches": 0, "ties": 3},
        {"test": "hypothesis", "elements": 3000, "mismatches": 2, "ties": 9},
        {"test": "rounding", "mode": "half-to-even", "saturates": True, "ties": []},
        {"test": "frontend", "elements": 500, "mismatches": 0},
        {"test": "torch cudnn parity", "elements": 800, "mismatches": 1},
    ]}
    rows = [{"layer": "resnet 56x56 3x3 64->64", "gop": 14.8, "qkern": (0.5, 0.4, 0.7),
             "qkern plan": {"engine": 12, "form": "virtual", "workspace": 0},
             "qkern autotune": (0.45, 0.4, 0.5), "qkern.torch": (0.55, 0.5, 0.6),
             "cudnn-frontend": (0.5, 0.4, 0.6),
             "torch fp16 NHWC": (0.3, 0.29, 0.4),
             "torch quantized": "unavailable: NotImplementedError: x"}]
    text = gpu_check.table(tests, rows)
    lines = text.splitlines()
    assert lines[0] == "GPU tests: 7 passed in 80.0s (80 s)"
    assert "hypothesis shapes: 2, elements 4000, mismatches 2 (5.00e-04)" in lines[1]
    assert "rounding: half-to-even, saturates: True; frontend mismatches: 0 of 500" == lines[2]
    assert lines[3].startswith("torch.ops.quantized.conv2d (cuDNN) vs qkern.torch: "
                               "mismatches 1 of 800")
    assert lines[-1].split()[-1] == "12/virtual"
    assert lines[-1].split()[5:8] == ["0.500", "0.450", "0.550"]
    assert "unavailable" in lines[-1]
    # Rows recorded before the torch layer was timed have no such column.
    del rows[0]["qkern.torch"]
    assert gpu_check.table(tests, rows).splitlines()[-1].split()[7] == "-"


def test_median_ms_and_fmt():
    calls = []
    med, lo, hi = gpu_check.median_ms(lambda: calls.append(1), lambda: None, runs=5)
    assert len(calls) == 8 and lo <= med <= hi
    assert gpu_check.fmt((1.23456, 1, 2)) == "1.235" and gpu_check.fmt(None) == "-"


def test_shell_wrapper_is_executable_and_calls_the_script():
    sh = ROOT / "benchmarks" / "gpu_check.sh"
    assert os.access(sh, os.X_OK)
    text = sh.read_text()
    assert "benchmarks/gpu_check.py" in text and "build_clib build_ext --inplace" in text
