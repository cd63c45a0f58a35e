"""The fuzz targets (tests/fuzz_targets.py) in every test run: each on
hypothesis-drawn bytes, and controls showing that their checks catch a
wrong result, a stray write, a call accepted that must be refused, and an
argument parser that lets a bad value through.

tests/fuzz.py runs the same targets coverage-guided (``make fuzz``); here
they also run under the sanitizers (``make sanitize``).
"""

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fuzz_targets
import qkern
from fuzz_targets import (
    TARGETS,
    Draw,
    Finding,
    WoqCall,
    call_refusals,
    check_cli_args,
    param_refusals,
)
from qkern.__main__ import build_parser


@pytest.mark.parametrize("name", sorted(TARGETS))
@settings(max_examples=150)
@given(data=st.binary(max_size=1024))
def test_fuzz_target(name, data):
    TARGETS[name](data)


def _valid_call_bytes() -> bytes:
    """Bytes that decode to a valid weight_int8pack_mm call with a non-empty
    result written into a given ``out``."""
    rnd = random.Random(0)
    while True:
        data = bytes(rnd.getrandbits(8) for _ in range(512))
        c = WoqCall(Draw(data))
        out, threads = c.draw_out(), c.draw_threads()
        if out is None or not out.size or param_refusals(c.w, c.scales, c.bias, None):
            continue
        inputs = (("x", c.x), ("w", c.w), ("scales", c.scales), ("bias", c.bias))
        if not call_refusals(c.x, c.scales.dtype, c.w.shape[1], c.n, out, inputs, threads):
            return data


def _control(monkeypatch, wrap, data: bytes) -> str:
    """The Finding raised, on ``data``, when weight_int8pack_mm is replaced by
    wrap(original)."""
    TARGETS["weight_int8pack_mm"](data)  # the real function passes
    monkeypatch.setattr(qkern, "weight_int8pack_mm", wrap(qkern.weight_int8pack_mm))
    with pytest.raises(Finding) as info:
        TARGETS["weight_int8pack_mm"](data)
    return str(info.value)


def test_control_wrong_result_is_a_finding(monkeypatch):
    def wrap(f):
        def wrong(*args, **kwargs):
            y = f(*args, **kwargs)
            y[tuple(n - 1 for n in y.shape)] = 1e4  # far outside any bound for these values
            return y
        return wrong
    assert "reference bound" in _control(monkeypatch, wrap, _valid_call_bytes())


def test_control_write_outside_out_is_a_finding(monkeypatch):
    def wrap(f):
        def stray(*args, out=None, **kwargs):
            y = f(*args, out=out, **kwargs)
            buf = out
            while buf.base is not None:
                buf = buf.base
            lowest = min(0, sum((n - 1) * s for n, s in zip(out.shape, out.strides) if s < 0))
            at = out.__array_interface__["data"][0] + lowest - 1 - buf.ctypes.data
            buf.reshape(-1).view(np.uint8)[at] ^= 1  # the byte just below out
            return y
        return stray
    assert "changed outside out" in _control(monkeypatch, wrap, _valid_call_bytes())


def test_control_accepting_a_forbidden_call_is_a_finding(monkeypatch):
    data = _valid_call_bytes()
    c = WoqCall(Draw(data))
    assert not param_refusals(c.w, c.scales, c.bias, None)
    # the same call with num_threads=0, which must be refused
    monkeypatch.setattr(WoqCall, "draw_threads", lambda self: 0)

    def wrap(f):
        return lambda *args, num_threads=None, **kwargs: f(*args, **kwargs)
    assert "must be refused" in _control(monkeypatch, wrap, data)


def test_control_cli_accepting_a_bad_thread_count_is_a_finding(monkeypatch):
    check_cli_args(["bench", "--threads", "3"])
    check_cli_args(["bench", "--threads", "0"])  # a usage error: passes

    def lax_parser():
        parser = build_parser()
        bench = parser._subparsers._group_actions[0].choices["bench"]
        next(a for a in bench._actions if a.dest == "threads").type = int
        return parser
    monkeypatch.setattr(fuzz_targets, "build_parser", lax_parser)
    with pytest.raises(Finding, match="--threads 0 accepted"):
        check_cli_args(["bench", "--threads", "0"])


def test_control_cli_accepting_a_bad_tune_shape_is_a_finding(monkeypatch):
    check_cli_args(["tune", "--shapes", "64x8", "--m", "1,3", "--dtypes", "float32"])
    check_cli_args(["tune", "--shapes", "64x0"])  # a usage error: passes

    def lax_parser():
        parser = build_parser()
        tune = parser._subparsers._group_actions[0].choices["tune"]
        next(a for a in tune._actions if a.dest == "shapes").type = \
            lambda text: tuple(int(v) for v in text.split("x"))
        return parser
    monkeypatch.setattr(fuzz_targets, "build_parser", lax_parser)
    with pytest.raises(Finding, match="--shapes .* accepted"):
        check_cli_args(["tune", "--shapes", "64x0"])
