"""Helpers for tests that need a process of their own: a crash, a hang, a
fork or a resource limit must not take the test run down with it."""

import os
import subprocess
import sys
import textwrap


def asan_loaded() -> bool:
    """Whether AddressSanitizer's runtime is loaded (``make sanitize``)."""
    with open("/proc/self/maps") as f:
        return "libasan" in f.read()


def run_python(source: str, timeout: float = 120, env: dict | None = None
               ) -> subprocess.CompletedProcess:
    """Run ``source`` (dedented) in a fresh interpreter, output captured,
    with ``env`` added to this process's environment.

    A run past ``timeout`` seconds is killed and raises
    :class:`subprocess.TimeoutExpired`, so a hang fails the calling test.
    """
    return subprocess.run([sys.executable, "-c", textwrap.dedent(source)], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})
