"""The GPU check of the fused int8 conv2d, in one run of under 8 minutes.

On a machine with an NVIDIA GPU, cuda.core and cuDNN (after
benchmarks/gpu_check.sh has built qkern):

1. runs the GPU-marked tests (tests/qconv/test_qconv_gpu.py: >= 200 hypothesis
   shapes against the exact reference, the cudnn-frontend cross-check,
   the rounding/saturation probe, plans, interop; tests/torch_layer/test_torch_qconv_gpu.py:
   qkern.torch on CUDA tensors, streams, the module's device layer, parity
   with PyTorch's cuDNN quantized conv), collecting their report;
2. times qkern (QConv2d, plans cached; and autotuned; and qkern.torch.QConv2d
   on a channels_last tensor) against the cudnn-frontend graph, cuDNN's fp16
   NHWC convolution through PyTorch and ``torch.ops.quantized.conv2d`` when
   that exists, on ResNet-like layers, recording the engine and form qkern ran;
3. prints a short table last, and writes everything to --out as JSON.

Without a GPU it says so and exits with status 2, before doing anything.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (name, N, H, W, C, O, k, stride, padding)
LAYERS = [
    ("resnet 56x56 3x3 64->64", 8, 56, 56, 64, 64, 3, 1, 1),
    ("resnet 28x28 3x3 128->128", 8, 28, 28, 128, 128, 3, 1, 1),
    ("resnet 14x14 1x1 256->1024", 8, 14, 14, 256, 1024, 1, 1, 0),
    ("stem 224 7x7/2 3->64", 8, 224, 224, 3, 64, 7, 2, 3),
]


TEST_FILES = ("qconv/test_qconv_gpu.py", "torch_layer/test_torch_qconv_gpu.py")


def gpu_reason() -> str | None:
    """Why the GPU path cannot run here, or None."""
    try:
        import qkern.cudnn
    except ImportError as e:
        return f"qkern is not built here ({e})"
    return qkern.cudnn.unavailable_reason()


def median_ms(fn, sync, runs: int = 20) -> tuple[float, float, float]:
    """(median, min, max) milliseconds of ``fn`` over ``runs`` after 3 warm-ups."""
    for _ in range(3):
        fn()
    sync()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), min(times), max(times)


def run_tests(out: Path, examples: int) -> dict:
    report = out / "gpu_tests.jsonl"
    report.unlink(missing_ok=True)
    env = dict(os.environ, QKERN_GPU_REPORT=str(report), QKERN_GPU_EXAMPLES=str(examples),
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests"),
                                           os.environ.get("PYTHONPATH", "")]))
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                           *(str(ROOT / "tests" / name) for name in TEST_FILES)], env=env,
                          cwd=ROOT, capture_output=True, text=True)
    lines = [json.loads(s) for s in report.read_text().splitlines()] if report.exists() else []
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "(no output)"
    print(proc.stdout[-6000:], proc.stderr[-2000:], sep="\n")
    return {"returncode": proc.returncode, "summary": summary, "seconds": time.time() - t0,
            "records": lines}


def bench(out: Path) -> list[dict]:
    import numpy as np
    import torch

    import qkern
    from qkern._conv_spec import epilogue_constants

    sys.path.insert(0, str(ROOT / "tests"))
    import frontend_graph

    rows = []
    sync = torch.cuda.synchronize
    for name, n, h, w, c, o, k, s, p in LAYERS:
        rng = np.random.default_rng(0)
        x = rng.integers(-128, 128, (n, h, w, c), dtype=np.int8)
        wt = rng.integers(-128, 128, (o, k, k, c), dtype=np.int8)
        bias = rng.standard_normal(o).astype(np.float32)
        kw = dict(act_scale=0.05, weight_scale=0.004, out_scale=0.2, stride=s, padding=p, relu=True)
        oh = (h + 2 * p - k) // s + 1
        gop = 2 * n * oh * oh * o * k * k * c / 1e9
        xt = torch.from_numpy(x).cuda()
        row = {"layer": name, "gop": gop}
        for label, autotune in (("qkern", False), ("qkern autotune", True)):
            layer = qkern.cudnn.QConv2d(wt, bias, autotune=autotune, **kw)
            y = layer(xt)
            row[label] = median_ms(lambda: layer(xt, out=y), sync)
            row[label + " plan"] = {k2: v for k2, v in layer.last_plan.items() if k2 != "json"}
        try:
            cpad = -(-c // 4) * 4
            xp = torch.zeros((n, h, w, cpad), dtype=torch.int8, device="cuda")
            xp[..., :c] = xt
            wp = torch.zeros((o, k, k, cpad), dtype=torch.int8, device="cuda")
            wp[..., :c] = torch.from_numpy(wt).cuda()
            ep = epilogue_constants(o, bias, act_scale=0.05, weight_scale=0.004, out_scale=0.2,
                                    relu=True)
            run = frontend_graph.build(torch, xp, wp, torch.from_numpy(ep.bias).cuda(),
                                       torch.from_numpy(ep.multiplier).cuda(), stride=(s, s),
                                       padding=((p, p), (p, p)), dilation=(1, 1), relu=True)
            row["cudnn-frontend"] = median_ms(run, sync)
        except Exception as e:                    # recorded, not fatal: the table says why
            row["cudnn-frontend"] = f"failed: {type(e).__name__}: {e}"[:200]
        xh = torch.randn((n, c, h, w), device="cuda", dtype=torch.float16).to(
            memory_format=torch.channels_last)
        conv = torch.nn.Conv2d(c, o, k, s, p).cuda().half().to(memory_format=torch.channels_last)
        with torch.no_grad():
            row["torch fp16 NHWC"] = median_ms(lambda: conv(xh), sync)
        row["qkern.torch"] = torch_layer(torch, xt, wt, bias, kw, sync)
        row["torch quantized"] = quantized_peer(torch, n, h, w, c, o, k, s, p, sync)
        rows.append(row)
        print(json.dumps(row), flush=True)
    (out / "bench.json").write_text(json.dumps(rows, indent=1))
    return rows


def torch_layer(torch, xt, wt, bias, kw, sync):
    """qkern.torch.QConv2d on the channels_last view of NHWC ``xt``, a new output per call."""
    import qkern.torch as qt

    try:
        layer = qt.QConv2d(torch.from_numpy(wt).permute(0, 3, 1, 2).cuda(),
                           torch.from_numpy(bias), **kw)
        x = xt.permute(0, 3, 1, 2)
        with torch.no_grad():
            return median_ms(lambda: layer(x), sync)
    except Exception as e:                        # recorded, not fatal: the table says why
        return f"failed: {type(e).__name__}: {e}"[:200]


def quantized_peer(torch, n, h, w, c, o, k, s, p, sync):
    """torch.ops.quantized.conv2d on CUDA (PyTorch's cuDNN int8 path), where it exists."""
    try:
        xq = torch.quantize_per_tensor(torch.randn(n, c, h, w, device="cuda"), 0.05, 0,
                                       torch.qint8).contiguous(memory_format=torch.channels_last)
        wq = torch.quantize_per_tensor(torch.randn(o, c, k, k, device="cuda"), 0.004, 0,
                                       torch.qint8).contiguous(memory_format=torch.channels_last)
        packed = torch.ops.quantized.conv2d_prepack(wq, None, [s, s], [p, p], [1, 1], 1)
        fn = lambda: torch.ops.quantized.conv2d_relu(xq, packed, 0.2, 0)  # noqa: E731
        return median_ms(fn, sync)
    except Exception as e:
        return f"unavailable: {type(e).__name__}: {str(e)[:120]}"


def fmt(v) -> str:
    if isinstance(v, (tuple, list)) and len(v) == 3:
        return f"{v[0]:.3f}"
    return "-" if v is None else str(v)[:14]


def table(tests: dict, rows: list[dict]) -> str:
    recs = tests["records"]
    hyp = [r for r in recs if r["test"] == "hypothesis"]
    elements = sum(r["elements"] for r in hyp)
    mism = sum(r["mismatches"] for r in hyp)
    rounding = next((r for r in recs if r["test"] == "rounding"), {})
    frontend = next((r for r in recs if r["test"] == "frontend"), {})
    parity = next((r for r in recs if r["test"] == "torch cudnn parity"), {})
    lines = [
        f"GPU tests: {tests['summary']} ({tests['seconds']:.0f} s)",
        f"hypothesis shapes: {len(hyp)}, elements {elements}, mismatches {mism} "
        f"({mism / max(elements, 1):.2e}), all at fp32 ties by the test's assertion",
        f"rounding: {rounding.get('mode', '?')}, saturates: {rounding.get('saturates', '?')}; "
        f"frontend mismatches: {frontend.get('mismatches', '?')} of "
        f"{frontend.get('elements', '?')}",
        f"torch.ops.quantized.conv2d (cuDNN) vs qkern.torch: mismatches "
        f"{parity.get('mismatches', '?')} of {parity.get('elements', '?')}, all at fp32 ties "
        "by the test's assertion",
        "",
        f"{'layer':30s} {'GOP':>6s} {'qkern':>8s} {'autotune':>8s} {'q.torch':>8s} "
        f"{'frontend':>8s} {'fp16':>8s} {'torch q':>8s}  engine/form (ms, medians)",
    ]
    for r in rows:
        plan = r["qkern plan"]
        lines.append(f"{r['layer']:30s} {r['gop']:6.1f} {fmt(r['qkern']):>8s} "
                     f"{fmt(r['qkern autotune']):>8s} {fmt(r.get('qkern.torch')):>8s} "
                     f"{fmt(r['cudnn-frontend']):>8s} "
                     f"{fmt(r['torch fp16 NHWC']):>8s} {fmt(r['torch quantized']):>8s}  "
                     f"{plan['engine']}/{plan['form']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/qkern-gpu-check"))
    ap.add_argument("--examples", type=int, default=200, help="hypothesis shapes (>= 200)")
    ap.add_argument("--skip-bench", action="store_true")
    args = ap.parse_args(argv)
    reason = gpu_reason()
    if reason is not None:
        print(f"gpu_check: no GPU path on this machine, nothing run: {reason}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tests = run_tests(out, args.examples)
    rows = [] if args.skip_bench else bench(out)
    text = table(tests, rows)
    (out / "table.txt").write_text(text + "\n")
    print("\n" + text)
    return tests["returncode"]


if __name__ == "__main__":
    sys.exit(main())
