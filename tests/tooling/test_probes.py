"""The C probes of benchmarks/ (amx_tile_loads.c, port_mix.c), which
nothing else builds: each builds with the command its header gives (any
x86-64 GCC with the ISA flags) and, on a CPU that runs its ISA, prints
its tables with a figure in every row."""

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

import qkern

ROOT = Path(__file__).resolve().parents[2]
# they build and run their own programs, which QKERN_ISA does not cap:
# make test runs them once, in its uncapped pass
pytestmark = pytest.mark.skipif("QKERN_ISA" in os.environ,
                                reason="not capped by QKERN_ISA; the uncapped pass runs it")
# probe: the features its instructions need
PROBES = {"amx_tile_loads": ("amx_bf16",), "port_mix": ("avx512_bf16", "avx512_vbmi")}


def _header_command(name):
    """The build command of the probe's header comment, as one argument list."""
    text = (ROOT / "benchmarks" / f"{name}.c").read_text()
    match = re.search(rf"^ \*   (cc .*?)&& \./{name}$", text, re.M | re.S)
    assert match, f"{name}.c's header gives no build command"
    return shlex.split(re.sub(r"\\\n \*\s*", " ", match.group(1)))


def _build(name, tmp_path):
    if shutil.which("cc") is None:
        pytest.skip("needs a C compiler")
    command = _header_command(name)
    assert command[command.index("-o") + 1] == name, command
    command[command.index("-o") + 1] = str(tmp_path / name)
    build = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr
    return tmp_path / name


def _run(name, tmp_path):
    binary = _build(name, tmp_path)
    features = qkern.cpu_features()
    missing = [f for f in PROBES[name] if not features[f]]
    if missing:
        pytest.skip(f"{name} runs {', '.join(missing)}; this CPU has none")
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return run.stdout


@pytest.mark.parametrize("name", sorted(PROBES))
def test_the_header_command_builds_it(name, tmp_path):
    assert _build(name, tmp_path).exists()


def test_amx_tile_loads_prints_its_three_tables(tmp_path):
    out = _run("amx_tile_loads", tmp_path)
    loads = re.findall(r"^\s*(\d+)\s+(\d+) (tileloadd|tileloaddt1)\s+(\d+)\s+(\d+)$", out, re.M)
    assert len(loads) == 10, out
    assert all(int(row[3]) > 0 for row in loads), out
    beside = re.findall(r"^(nothing|32 vpsrad|32 vpermw|widen a chunk)\s+(\d+\.\d)\s+(\d+\.\d)"
                        r"\s+(\d+\.\d)$", out, re.M)
    assert [row[0] for row in beside] == ["nothing", "32 vpsrad", "32 vpermw", "widen a chunk"]
    assert all(float(x) > 0 for row in beside for x in row[1:]), out
    by_rows = re.findall(r"^\s*(\d+)\s+(\d+\.\d\d)\s+(\d+\.\d\d)$", out, re.M)
    assert [int(row[0]) for row in by_rows] == [1, 2, 4, 8, 16], out
    assert all(float(x) > 0 for row in by_rows for x in row[1:]), out


def test_port_mix_prints_a_clock_and_every_mix(tmp_path):
    """Every mix of eight instructions takes at least the 2 cycles of
    four loads or ALU slots a cycle and far less than a microcode assist
    (the bounds of a clock or an input gone wrong: 1800 cycles)."""
    out = _run("port_mix", tmp_path)
    clock = re.search(r"^clock (\d+\.\d+) GHz", out, re.M)
    assert clock and 0.5 < float(clock.group(1)) < 7, out
    mixes = re.findall(r"^([A-Z0-9]+)\s+\+ ([A-Z0-9]+)\s+(\d+\.\d+)$", out, re.M)
    assert len(mixes) == out.count("\n") - 1, out
    assert all(1.5 < float(m[2]) < 100 for m in mixes), out
