"""Find and load libcudnn, once, at first use.

Where it looks, in order:

1. ``cuda.pathfinder.load_nvidia_dynamic_lib("cudnn")`` when cuda-pathfinder
   is installed (the nvidia-cudnn-cu13 wheel, conda, system paths);
2. ``$CUDNN_PATH/lib/libcudnn.so.9`` (or ``$CUDNN_PATH/lib64``);
3. the ``nvidia-cudnn-cu13`` wheel's ``nvidia/cudnn/lib`` directory, found
   through importlib without importing anything of it.

cuda-pathfinder also loads cuDNN's own dependencies (cuBLASLt) and fails
when they are missing; the later candidates still let the library load,
enough to build and finalize graphs (running them needs cuBLASLt and a GPU).
"""

from __future__ import annotations

import importlib.util
import os
import threading

from qkern.cudnn import _api
from qkern.cudnn._errors import CudnnUnavailableError

__all__ = ["candidates", "ensure_loaded"]

SONAME = "libcudnn.so.9"
_lock = threading.Lock()


def _pathfinder():
    try:
        from cuda import pathfinder
    except ImportError:
        return None, "cuda-pathfinder is not installed"
    try:
        return pathfinder.load_nvidia_dynamic_lib("cudnn").abs_path, None
    except Exception as e:          # pathfinder's DynamicLib* errors and OSError
        return None, f"cuda.pathfinder: {type(e).__name__}: {e}"


def _wheel_dir() -> str | None:
    try:
        spec = importlib.util.find_spec("nvidia.cudnn")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.join(list(spec.submodule_search_locations)[0], "lib")


def candidates(use_pathfinder: bool = True) -> tuple[list[tuple[str, str]], list[str]]:
    """``([(source, path)], [notes])``: where libcudnn may be, best first, and why not elsewhere."""
    found, notes = [], []
    if use_pathfinder:
        path, note = _pathfinder()
        if path:
            found.append(("cuda.pathfinder", path))
        else:
            notes.append(note)
    root = os.environ.get("CUDNN_PATH")
    if root:
        for sub in ("lib", "lib64"):
            p = os.path.join(root, sub, SONAME)
            if os.path.exists(p):
                found.append(("CUDNN_PATH", p))
                break
        else:
            notes.append(f"CUDNN_PATH={root} has no lib/{SONAME} or lib64/{SONAME}")
    wheel = _wheel_dir()
    if wheel and os.path.exists(os.path.join(wheel, SONAME)):
        found.append(("nvidia-cudnn-cu13 wheel", os.path.join(wheel, SONAME)))
    else:
        notes.append("the nvidia-cudnn-cu13 wheel is not installed")
    return found, notes


def ensure_loaded() -> str:
    """Load libcudnn if not yet loaded; return its path.

    Raises
    ------
    CudnnUnavailableError
        No candidate loads; the message lists where qkern looked.
    """
    with _lock:
        if _api.loaded_path() is not None:
            return _api.loaded_path()
        found, notes = candidates()
        for source, path in found:
            try:
                _api.load(path)
                return path
            except OSError as e:
                notes.append(f"{source}: {e}")
        raise CudnnUnavailableError("cuDNN 9 was not found or did not load: " + "; ".join(notes))
