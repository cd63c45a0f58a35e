"""Graph construction against the real cuDNN library, without a GPU.

A child process loads libcudnn from the nvidia-cudnn-cu13 wheel, with a
stand-in libcuda.so.1 (cuda_driver_stub.c, compiled here with the system C
compiler) on its LD_LIBRARY_PATH, and finalizes every tensor, convolution,
pointwise, operation and operation-graph descriptor of every variant
(cudnn_finalize_check.py).  Without the wheel these tests skip, unless
QKERN_REQUIRE_CUDNN=1 (set by `make test`, so CI fails instead of skipping).
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from qkern.cudnn import _loader

HERE = Path(__file__).parent


def _wheel_library():
    found, _ = _loader.candidates(use_pathfinder=False)
    paths = [p for source, p in found if source == "nvidia-cudnn-cu13 wheel"]
    if not paths:
        if os.environ.get("QKERN_REQUIRE_CUDNN") == "1":
            pytest.fail("QKERN_REQUIRE_CUDNN=1 but the nvidia-cudnn-cu13 wheel is not installed")
        pytest.skip("the nvidia-cudnn-cu13 wheel is not installed (pip install nvidia-cudnn-cu13)")
    return paths[0]


@pytest.fixture(scope="module")
def stub_driver_dir(tmp_path_factory):
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        pytest.fail("no C compiler to build the stand-in driver (qkern's build needs one too)")
    out = tmp_path_factory.mktemp("stub_driver")
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-Wl,-soname,libcuda.so.1", "-o",
                    str(out / "libcuda.so.1"), str(HERE / "cuda_driver_stub.c")], check=True)
    return out


def _child_env(lib_dirs):
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join([str(d) for d in lib_dirs] +
                                             [env.get("LD_LIBRARY_PATH", "")]).rstrip(os.pathsep)
    env.pop("CUDNN_PATH", None)
    return env


@pytest.fixture(scope="module")
def report(stub_driver_dir):
    _wheel_library()
    proc = subprocess.run([sys.executable, str(HERE / "cudnn_finalize_check.py")],
                          env=_child_env([stub_driver_dir]), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout)


def test_library_is_cudnn9(report):
    assert report["version"] >= 90000
    assert report["library"].endswith("libcudnn.so.9")


def test_every_descriptor_of_every_variant_finalizes(report):
    variants = report["variants"]
    assert len(variants) == 7 * 16
    failed = {k: v["error"] for k, v in variants.items() if "error" in v}
    assert not failed, failed
    for key, v in variants.items():
        kinds = [kind for _, kind, _ in v["descriptors"]]
        not_final = [role for role, _, done in v["descriptors"] if not done]
        assert not not_final, (key, not_final)
        assert kinds.count("OPERATIONGRAPH") == 1 and kinds[-1] == "OPERATIONGRAPH"
        assert kinds.count("CONVOLUTION") == 1 and kinds.count("OPERATION_CONVOLUTION_FORWARD") == 1
        n_pointwise = 1 + ("bias=True" in key) + ("relu=True" in key)
        assert kinds.count("OPERATION_POINTWISE") == n_pointwise == kinds.count("POINTWISE")
        # x, w, conv out, y, multiplier; bias and add out; relu out.
        assert kinds.count("TENSOR") == 4 + 1 + 2 * ("bias=True" in key) + ("relu=True" in key)


def test_without_the_driver_finalization_fails_with_a_named_status(tmp_path):
    # The same child without the stand-in driver: cuDNN cannot load its engines.
    _wheel_library()
    script = ("from qkern._conv_spec import geometry\n"
              "from qkern.cudnn import CudnnError, _loader\n"
              "from qkern.cudnn._conv import graph_spec\n"
              "from qkern.cudnn._graph import QConvGraph\n"
              "_loader.ensure_loaded()\n"
              "g = geometry((1, 4, 4, 4), (4, 3, 3, 4))\n"
              "try:\n"
              "    QConvGraph(graph_spec(g, bias=True, relu=True, per_channel=False))\n"
              "except CudnnError as e:\n"
              "    print(e.status_name, '|', e.step, '|', e.problem)\n")
    env = _child_env([])
    if any(Path(d, "libcuda.so.1").exists() for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64")):
        pytest.skip("this machine has a real libcuda.so.1")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    name, step, problem = (s.strip() for s in proc.stdout.split("|"))
    assert name == "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED"
    assert step == "finalize TENSOR 'x'"
    assert "x[1, 4, 4, 4]" in problem and "virtual form" in problem
