"""benchmarks/amx_tile_loads.c builds with the command its header gives
(any x86-64 compiler with the AMX flags) and, on a CPU with AMX, prints
both of its tables with a figure in every row."""

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

import qkern

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "benchmarks" / "amx_tile_loads.c"


def _header_command():
    """The build command of the header comment, as one argument list."""
    text = SOURCE.read_text()
    match = re.search(r"^ \*   (cc .*?)&& \./amx_tile_loads$", text, re.M | re.S)
    assert match, "the header gives no build command"
    command = re.sub(r"\\\n \*\s*", " ", match.group(1))
    return shlex.split(command)


@pytest.fixture(scope="module")
def binary(tmp_path_factory):
    if shutil.which("cc") is None:
        pytest.skip("needs a C compiler")
    out = tmp_path_factory.mktemp("amx_tile_loads") / "amx_tile_loads"
    command = _header_command()
    assert command[command.index("-o") + 1] == "amx_tile_loads", command
    command[command.index("-o") + 1] = str(out)
    build = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr
    return out


def test_the_header_command_builds_it(binary):
    assert binary.exists()


@pytest.mark.skipif(not qkern.cpu_features()["amx_bf16"], reason="runs AMX; this CPU has none")
def test_it_prints_both_tables(binary):
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    loads = re.findall(r"^\s*(\d+)\s+(\d+) (tileloadd|tileloaddt1)\s+(\d+)\s+(\d+)$",
                       run.stdout, re.M)
    assert len(loads) == 10, run.stdout
    assert all(int(row[3]) > 0 for row in loads), run.stdout
    beside = re.findall(r"^(nothing|32 vpsrad|32 vpermw|widen a chunk)\s+(\d+\.\d)\s+(\d+\.\d)"
                        r"\s+(\d+\.\d)$", run.stdout, re.M)
    assert [row[0] for row in beside] == ["nothing", "32 vpsrad", "32 vpermw", "widen a chunk"]
    assert all(float(x) > 0 for row in beside for x in row[1:]), run.stdout
