"""Coverage-guided fuzzing of qkern's entry points with atheris (libFuzzer).

Usage (from the repository root, in the environment qkern is built in)::

    python tests/fuzz.py                          # every target, 60 s each
    python tests/fuzz.py WoqLinear --seconds 3600 # one target, an hour
    python tests/fuzz.py --replay weight_int8pack_mm build/fuzz/weight_int8pack_mm/crash-...

The targets and the contract they check are in tests/fuzz_targets.py.  Each
target runs in a process of its own (libFuzzer ends the process when it
stops), with qkern's Python code and the targets instrumented for coverage;
the C kernels are not instrumented, so coverage steers the choice of
shapes, layouts and arguments, and the checks catch what the kernels do
with them.  Per target, build/fuzz/<target>/ keeps the corpus (reused by
the next run), the log, and any input that broke the contract, crashed,
ran past the time limit or past the memory limit (``crash-*``,
``timeout-*``, ``oom-*``); ``--replay`` runs such a file again.

Prints one line per target: runs, executions per second, corpus size and
findings.  Exits with status 1 if any target had a finding.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TIMEOUT_S = 30  # one input running longer than this is a hang
RSS_LIMIT_MB = 3072  # the process growing past this is a finding
MAX_LEN = 2048  # bytes per input; a call reads a few hundred
SEEDS = 64  # random inputs that start an empty corpus


def _target_names() -> list:
    sys.path.insert(0, HERE)
    from fuzz_targets import TARGETS

    return list(TARGETS)


def run_target(name: str, libfuzzer_args: list):
    """In this process: fuzz target `name` until libFuzzer stops (it exits)."""
    import atheris

    sys.path.insert(0, HERE)
    with atheris.instrument_imports(include=["qkern", "fuzz_targets"]):
        import fuzz_targets
    target = fuzz_targets.TARGETS[name]
    atheris.Setup([sys.argv[0], *libfuzzer_args], target)
    atheris.Fuzz()


def fuzz(name: str, seconds: int, out_dir: str) -> bool:
    """Fuzz `name` for `seconds` in a child process; print a summary line.

    Returns whether the run ended without a finding.
    """
    work = os.path.join(out_dir, name)
    corpus = os.path.join(work, "corpus")
    os.makedirs(corpus, exist_ok=True)
    if not os.listdir(corpus):
        # Random inputs of a call's length: libFuzzer's own start (empty input,
        # lengths growing slowly) would spend the run on tiny problems.
        rnd = random.Random(0)
        for i in range(SEEDS):
            with open(os.path.join(corpus, f"seed-{i:03d}"), "wb") as f:
                f.write(bytes(rnd.getrandbits(8) for _ in range(rnd.choice((64, 256, 512, 1024)))))
    log_path = os.path.join(work, "log.txt")
    args = [f"-max_total_time={seconds}", f"-timeout={TIMEOUT_S}", f"-rss_limit_mb={RSS_LIMIT_MB}",
            f"-max_len={MAX_LEN}", "-len_control=0", "-print_final_stats=1",
            f"-artifact_prefix={work}/", corpus]
    start = time.monotonic()
    with open(log_path, "w") as log:
        rc = subprocess.run([sys.executable, __file__, "--child", name, *args],
                            stdout=log, stderr=subprocess.STDOUT).returncode
    elapsed = time.monotonic() - start
    with open(log_path) as log:
        text = log.read()
    runs = re.findall(r"stat::number_of_executed_units: (\d+)", text)
    findings = sorted(f for f in os.listdir(work) if f.split("-")[0] in ("crash", "timeout", "oom"))
    count = int(runs[-1]) if runs else 0
    summary = (f"fuzz {name}: {count} runs in {elapsed:.0f} s ({count / elapsed:.0f}/s), "
               f"corpus {len(os.listdir(corpus))} inputs, {len(findings)} findings "
               f"(exit status {rc})")
    print(summary, flush=True)
    if rc != 0 or findings:
        print(text[-6000:], file=sys.stderr)
        for f in findings:
            print(f"  reproduce: python tests/fuzz.py --replay {name} {os.path.join(work, f)}",
                  file=sys.stderr)
        return False
    return True


def main(argv=None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--child"]:
        run_target(argv[1], argv[2:])
        return 0
    names = _target_names()
    parser = argparse.ArgumentParser(prog="python tests/fuzz.py",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("targets", nargs="*", metavar="TARGET",
                        help=f"targets to run (default: all of {', '.join(names)})")
    parser.add_argument("--seconds", type=int, default=60, help="per target (default 60)")
    parser.add_argument("--out", default=os.path.join("build", "fuzz"),
                        help="folder for corpora, logs and findings (default build/fuzz)")
    parser.add_argument("--replay", nargs=2, metavar=("TARGET", "FILE"),
                        help="run one saved input through TARGET and show the outcome")
    args = parser.parse_args(argv)
    if args.replay:
        name, path = args.replay
        return subprocess.run([sys.executable, __file__, "--child", name, path]).returncode
    unknown = set(args.targets) - set(names)
    if unknown:
        parser.error(f"unknown targets {sorted(unknown)}; known: {names}")
    ok = [fuzz(name, args.seconds, args.out) for name in args.targets or names]
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
