"""The benchmark scripts of benchmarks/ (not a package), for the tests."""

import importlib.util
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def runtimes_module():
    """``benchmarks/runtimes.py`` as the module ``peers.py`` imports by name
    (one instance, in ``sys.modules``)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    return importlib.import_module("runtimes")


def load_benchmark(name: str):
    """``benchmarks/<name>.py`` as a module, imported by path (with its folder
    on ``sys.path``: the benchmark modules import each other by name)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
