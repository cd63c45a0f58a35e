"""qkern.tuning: verified candidates, the cache in memory and on disk, the
autotune mode of WoqLinear, and python -m qkern tune."""

import json
import pickle
import threading
import time
import warnings

import numpy as np
import pytest

import qkern
from process_support import run_python
from qkern import tuning
from qkern.__main__ import main

SHAPE = (3, 96, 80)  # M, N, K: small enough to tune in well under a second


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    """Each test tunes into a fresh file and an empty memory cache."""
    monkeypatch.setenv("QKERN_CACHE_DIR", str(tmp_path))
    tuning.clear()
    yield tmp_path
    tuning.clear()


def _choice(dtype="float32", threads=1):
    m, n, k = SHAPE
    return tuning.choice_for(np.dtype(dtype), m, n, k, threads)


def _count_tunings(monkeypatch) -> list:
    calls = []
    real = tuning._tune

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(tuning, "_tune", counting)
    return calls


def test_every_candidate_is_verified_before_it_is_timed(monkeypatch):
    verified = []
    monkeypatch.setattr(tuning, "_verify_hook", lambda cand, y: verified.append(cand) or y)
    choice = _choice()
    assert len(set(verified)) == len(verified) >= choice.candidates >= 2
    kern = qkern.dispatch.get_kernel(choice.kernel)
    assert kern.available and "float32" in kern.dtypes and choice.threads == 1
    static_isa = qkern.dispatch.get_kernel(choice.static_kernel).isa
    assert kern.isa in (static_isa, *tuning.TUNED_WITH.get(static_isa, ()))


def test_tuned_threads_never_exceed_the_calls():
    """A problem with work for two threads: the key of two threads may
    choose one or two, the key of one thread only one."""
    for threads in (1, 2):
        choice = tuning.choice_for(np.dtype(np.float32), 8, 512, 1024, threads)
        assert 1 <= choice.threads <= threads


def test_cache_round_trip_through_the_file(cache_dir, monkeypatch):
    first = _choice()
    data = json.loads((cache_dir / "tune.json").read_text())
    (entry,) = data["entries"]
    assert entry["qkern"] == qkern.__version__ and entry["cpu"] == tuning.cpu_signature()
    assert not list(cache_dir.glob(".tune-*"))  # no temporary file left
    tuning.clear()  # a new process: memory empty, the file remains
    calls = _count_tunings(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _choice() == first
    assert calls == []


def _foreign(entry, **changes):
    return {**entry, **changes}


@pytest.mark.parametrize("edit, warning, kept", [
    (lambda d: "{ not json", "not a valid tuning file", 0),
    (lambda d: b"\xff\xfe", "not a valid tuning file", 0),
    (lambda d: json.dumps({**d, "entries": [{"key": [1]}]}), "has 1 malformed entry", 0),
    (lambda d: "[" * 100000 + "]" * 100000, "not a valid tuning file", 0),
    (lambda d: json.dumps({**d, "entries": [_foreign(d["entries"][0], cpu={
        **d["entries"][0]["cpu"], "model_name": "Other CPU"})]}), "another CPU", 1),
    (lambda d: json.dumps({**d, "entries": [_foreign(d["entries"][0], qkern="0.0.1")]}),
     "qkern 0.0.1", 1),
    (lambda d: json.dumps({**d, "entries": [_foreign(d["entries"][0], key=[])]}),
     "malformed entry", 0),
])
def test_corrupt_foreign_or_old_file_is_ignored_with_one_warning(cache_dir, monkeypatch, edit,
                                                                  warning, kept):
    """Nothing crashes; one warning; both keys tuned afresh; other CPUs'
    and versions' entries are kept when the file is written again."""
    _choice()
    path = cache_dir / "tune.json"
    text = edit(json.loads(path.read_text()))
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    tuning.clear()
    calls = _count_tunings(monkeypatch)
    with pytest.warns(RuntimeWarning, match=warning) as caught:
        _choice()
        _choice(dtype="bfloat16")  # another key: the file is not read again
    assert len([w for w in caught if warning in str(w.message)]) == 1
    assert len(calls) == 2
    entries = json.loads(path.read_text())["entries"]
    assert len(entries) == 2 + kept
    assert sum(e["qkern"] == qkern.__version__ and e["cpu"] == tuning.cpu_signature()
               for e in entries) == 2


def test_a_malformed_entry_costs_that_entry_only(cache_dir, monkeypatch):
    """docs/tuning.rst: a malformed entry is ignored with one warning; the
    file's sound entries, this CPU's and others', stay used and kept."""
    _choice()
    path = cache_dir / "tune.json"
    data = json.loads(path.read_text())
    (mine,) = data["entries"]
    bad_seconds = {**mine, "choice": {**mine["choice"], "static_seconds": "x"}}
    foreign = _foreign(mine, qkern="0.0.1")
    data["entries"] += [foreign, {"cpu": {}}, bad_seconds]
    path.write_text(json.dumps(data))
    tuning.clear()
    calls = _count_tunings(monkeypatch)
    with pytest.warns(RuntimeWarning, match="has 2 malformed entries") as caught:
        _choice()  # the sound entry: not tuned again
        _choice(dtype="bfloat16")  # a new key: the file is written again
    assert len(caught) == 1 and len(calls) == 1
    entries = json.loads(path.read_text())["entries"]
    assert foreign in entries and mine in entries and len(entries) == 3


def test_a_newer_qkerns_file_is_neither_used_nor_replaced(cache_dir, monkeypatch):
    _choice()
    path = cache_dir / "tune.json"
    newer = json.loads(path.read_text()) | {"format": tuning.FILE_FORMAT + 1}
    path.write_text(json.dumps(newer))
    tuning.clear()
    calls = _count_tunings(monkeypatch)
    with pytest.warns(RuntimeWarning) as caught:
        _choice()
    messages = [str(w.message) for w in caught]
    assert any("newer than this qkern's" in m for m in messages), messages
    assert any("results stay in memory" in m for m in messages), messages
    assert len(calls) == 1 and json.loads(path.read_text()) == newer


def test_the_cache_dir_may_start_with_a_tilde(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("QKERN_CACHE_DIR", "~/tuned ")
    assert tuning.cache_path() == tmp_path / "tuned" / "tune.json"


def test_another_isa_cap_is_another_key(cache_dir, monkeypatch):
    """A process under another QKERN_ISA neither uses nor drops this one's entry."""
    _choice()
    mine = qkern.dispatch.ISA_CAP
    monkeypatch.setattr(qkern.dispatch, "ISA_CAP", "another-cap")
    tuning.clear()
    calls = _count_tunings(monkeypatch)
    _choice()
    assert len(calls) == 1
    caps = sorted(e["key"][8] for e in json.loads((cache_dir / "tune.json").read_text())
                  ["entries"])
    assert caps == sorted(["another-cap", mine])


def test_an_unwritable_cache_dir_keeps_results_in_memory(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("QKERN_CACHE_DIR", str(blocker / "sub"))  # a folder under a file
    with pytest.warns(RuntimeWarning, match="cannot write"):
        first = _choice()
    assert _choice() == first


def test_a_stored_choice_this_cpu_cannot_run_is_tuned_again(cache_dir, monkeypatch):
    _choice()
    path = cache_dir / "tune.json"
    data = json.loads(path.read_text())
    data["entries"][0]["choice"]["kernel"] = "no_such_kernel"
    path.write_text(json.dumps(data))
    tuning.clear()
    calls = _count_tunings(monkeypatch)
    assert qkern.dispatch.get_kernel(_choice().kernel).available
    assert len(calls) == 1


def test_two_threads_tune_one_key_once(monkeypatch):
    calls = _count_tunings(monkeypatch)
    got, start = [], threading.Barrier(2)

    def worker():
        start.wait()
        got.append(_choice())

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and got[0] == got[1]


def test_the_first_thread_count_tuned_fixes_the_compute(monkeypatch):
    """The thread count changes no bit, autotuned too: once one thread count
    of a problem is tuned, the others choose among kernels of the same
    compute, even where another would be faster."""
    def computes(dtype, group_size):
        layout = tuning._layout(dtype, group_size)
        fmt = qkern.dispatch.INT4 if group_size else qkern.dispatch.INT8
        top = qkern.dispatch.top_level(np.dtype(dtype), layout, fmt)
        return sorted({tuning._compute(kern) for kern in tuning._kernels(dtype, layout, top, fmt)})

    problems = (("bfloat16", 0, SHAPE), ("float32", 32, (3, 96, 128)))
    cases = [(dtype, group_size, shape, computes(dtype, group_size))
             for dtype, group_size, shape in problems]
    cases = [case for case in cases if len(case[3]) > 1]
    if not cases:
        pytest.skip("every candidate here sums in one order")
    dtype, group_size, (m, n, k), (first, *_) = cases[0]

    def tuned(threads):
        choice = tuning.choice_for(np.dtype(dtype), m, n, k, threads, group_size=group_size)
        return tuning._compute(qkern.dispatch.get_kernel(choice.kernel))

    # one thread: only the kernels of `first` compute right
    monkeypatch.setattr(tuning, "_verify_hook",
                        lambda cand, y: y if tuning._compute(cand.kernel) == first else y + 1)
    with pytest.warns(RuntimeWarning, match="dropped"):
        assert tuned(1) == first
    # two threads: the kernels of `first` made slow, and still chosen
    monkeypatch.setattr(tuning, "_verify_hook", None)
    real_run = tuning._Problem.run

    def slow_first(problem, cand, x):
        if tuning._compute(cand.kernel) == first:
            time.sleep(0.002)
        return real_run(problem, cand, x)

    monkeypatch.setattr(tuning._Problem, "run", slow_first)
    assert tuned(2) == first


def _corrupt_split_n(cand, y):
    """A verification hook: one element of every split-"n" candidate's output off by one."""
    if cand.blocking.split == "n":
        y = y.copy()
        y.flat[0] += 1
    return y


def test_a_wrong_candidate_is_dropped(monkeypatch):
    """The test-only hook corrupts one element of every split-"n" candidate's
    verification output: none of them may win, each is reported."""
    monkeypatch.setattr(tuning, "_verify_hook", _corrupt_split_n)
    with pytest.warns(RuntimeWarning, match="wrong results on the tuning input: dropped"):
        choice = _choice()
    assert choice.blocking.split == "m"


def test_no_correct_candidate_is_an_error(monkeypatch):
    monkeypatch.setattr(tuning, "_verify_hook", lambda cand, y: y + 1)
    with pytest.warns(RuntimeWarning), pytest.raises(RuntimeError, match="no candidate"):
        _choice()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_autotuned_layer_gives_the_bits_of_its_kernel(monkeypatch, dtype):
    """Under QKERN_AUTOTUNE=1 a layer runs the tuned (kernel, blocking,
    threads): the bits of that kernel run untuned, since neither a blocking
    nor a thread count changes a result."""
    rng = np.random.default_rng(1)
    m, n, k = SHAPE
    w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    s = rng.uniform(0.01, 0.1, n).astype(dtype)
    x = rng.standard_normal((m, k)).astype(dtype)
    layer = qkern.WoqLinear(w, s)
    untuned = layer(x, num_threads=1)
    monkeypatch.setattr(tuning, "_ENV", "1")
    tuned = layer(x, num_threads=1)
    choice = tuning.choice_for(np.dtype(dtype), m, n, k, 1)
    assert layer.kernel_for(m, num_threads=1).name == choice.kernel
    same_kernel = qkern.WoqLinear(w, s, kernel=choice.kernel)(x, num_threads=1)
    assert np.array_equal(tuned.view(np.uint8), same_kernel.view(np.uint8))
    if choice.kernel == choice.static_kernel:
        assert np.array_equal(tuned.view(np.uint8), untuned.view(np.uint8))


def test_m_bucket():
    assert [tuning.m_bucket(m) for m in (1, 5, 16, 17, 64, 65, 1000)] == \
        [1, 5, 16, 32, 64, 128, 1024]


def test_autotune_variable_is_checked_at_import():
    proc = run_python("import qkern", env={"QKERN_AUTOTUNE": "yes"})
    assert proc.returncode != 0 and "QKERN_AUTOTUNE='yes'" in proc.stderr
    for value, mode in (("", False), (" 1\n", True)):  # as every QKERN_ variable
        proc = run_python("import qkern; print(qkern.tuning.autotune_enabled())",
                          env={"QKERN_AUTOTUNE": value})
        assert proc.returncode == 0 and proc.stdout.split() == [str(mode)], proc.stderr


def test_cli_tune_prints_the_table(capsys):
    assert main(["tune", "--shapes", "96x80", "--m", "1,3", "--dtypes", "float32",
                 "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "tuned choice" in out and "gain" in out and "tuning time per key" in out
    assert len([line for line in out.splitlines() if line.startswith("float32")]) == 2


def test_int4_layers_tune_their_own_keys(cache_dir, monkeypatch):
    """An Int4Linear under QKERN_AUTOTUNE=1 tunes an int4 key (its own kernels,
    verified on an exact int4 input), apart from the int8 key of the shape,
    and its result is the bits of the chosen kernel forced."""
    rng = np.random.default_rng(2)
    m, n, k = SHAPE[0], SHAPE[1], 128
    layer = qkern.Int4Linear.from_float(rng.standard_normal((n, k)).astype(np.float32), 64)
    x = rng.standard_normal((m, k)).astype(np.float32)
    untuned = layer(x, num_threads=1)
    verified = []
    monkeypatch.setattr(tuning, "_verify_hook", lambda cand, y: verified.append(cand) or y)
    monkeypatch.setattr(tuning, "_ENV", "1")
    tuned = layer(x, num_threads=1)
    choice = tuning.choice_for(np.dtype(np.float32), m, n, k, 1, group_size=64)
    kern = qkern.dispatch.get_kernel(choice.kernel)
    assert kern.weight_format == qkern.dispatch.INT4 and verified
    assert all(c.kernel.weight_format == qkern.dispatch.INT4 for c in verified)
    assert layer.kernel_for(m, num_threads=1).name == choice.kernel
    forced = qkern.Int4Linear(layer.packed_weight, 64, layer.scales_and_zeros,
                              kernel=choice.kernel)(x, num_threads=1)
    assert np.array_equal(tuned.view(np.uint8), forced.view(np.uint8))
    if choice.kernel == choice.static_kernel:  # f32dq_qb4w sums in another order
        assert np.array_equal(tuned.view(np.uint8), untuned.view(np.uint8))
    tuning.choice_for(np.dtype(np.float32), m, n, k, 1)  # the int8 key of the shape
    weights = sorted(e["key"][7] for e in json.loads((cache_dir / "tune.json").read_text())
                     ["entries"])
    assert weights == ["int4g64", "int8"]


def test_a_wrong_int4_candidate_is_dropped(monkeypatch):
    monkeypatch.setattr(tuning, "_verify_hook", _corrupt_split_n)
    with pytest.warns(RuntimeWarning, match="split='n'.*dropped"):
        choice = tuning.choice_for(np.dtype(np.float32), 3, 96, 128, 1, group_size=32)
    assert choice.blocking.split == "m"


def test_cli_tunes_int4(capsys):
    assert main(["tune", "--shapes", "96x128", "--m", "1", "--dtypes", "float32",
                 "--threads", "1", "--int4-group", "32"]) == 0
    out = capsys.readouterr().out
    assert "int4 g32" in out and "f32_qb4w_gemm" in out
    with pytest.raises(ValueError, match="group_size: expected 0"):
        qkern.tune([(1, 96, 128)], group_size=48)
    with pytest.raises(ValueError, match="K=100 is not a multiple of group_size=32"):
        qkern.tune([(1, 96, 100)], group_size=32)
    with pytest.raises(SystemExit):
        main(["tune", "--shapes", "96x100", "--int4-group", "32"])
    assert "every K of --shapes must be a multiple" in capsys.readouterr().err


def test_tune_checks_its_arguments_before_tuning():
    """Shapes, dtypes and thread counts are checked as a call's are, with
    the argument named, before any timing (nothing is tuned or stored)."""
    cases = [
        (TypeError, r"shapes: expected \(M, N, K\) of ints", dict(shapes=[(1.7, 16, 16)])),
        (ValueError, r"shapes: expected \(M, N, K\), each at least 1", dict(
            shapes=[(0, 16, 16)])),
        (ValueError, "each at least 1", dict(shapes=[(1, 16)])),
        (TypeError, "dtypes: expected dtype float32, float16 or bfloat16", dict(
            dtypes=["float64"])),
        (ValueError, "threads: expected 1 to", dict(threads=[-1])),
        (ValueError, "threads: expected 1 to", dict(threads=[2**40])),
        (TypeError, "threads: expected an int", dict(threads=[1.5])),
    ]
    for error, match, change in cases:
        args = dict(shapes=[(1, 16, 16)]) | change
        with pytest.raises(error, match=match):
            qkern.tune(**args)


def _widening_kernel(dtype="float32"):
    """The kernel that runs on a widened copy at the static choice's level, or skip."""
    m, n, k = SHAPE
    isa = qkern.dispatch.choose_kernel(np.dtype(dtype), m).isa
    found = [kern for kern in qkern.kernels() if kern.available and kern.isa == isa
             and kern.reads_widened_copy and dtype in kern.dtypes]
    if not found:
        pytest.skip(f"no kernel of level {isa} runs on a widened copy")
    return found[0]


def _prefer_widened(kern):
    """A verification hook: every candidate but ``kern`` on its widened copy
    is wrong (on a CPU with AMX, a widened candidate of the other level
    might otherwise win the timing)."""
    return lambda cand, y: y if cand.widened and cand.kernel == kern else y + 1


def test_a_widened_copy_is_a_candidate_only_within_the_budget(monkeypatch):
    kern = _widening_kernel()
    m, n, k = SHAPE
    size = qkern.dispatch.widened_nbytes(kern, n, k)
    verified = []
    monkeypatch.setattr(tuning, "_verify_hook", lambda cand, y: verified.append(cand) or y)
    tuning.choice_for(np.dtype(np.float32), m, n, k, 1, memory_budget=size - 1)
    assert verified and not any(c.widened for c in verified)
    assert not tuning.widened_ok(np.float32, n, k, kern.layout, size - 1)
    verified.clear()
    choice = tuning.choice_for(np.dtype(np.float32), m, n, k, 1, memory_budget=size)
    assert any(c.widened and c.kernel == kern for c in verified)
    assert not any(c.widened and not c.kernel.widened for c in verified)
    assert choice.weight_form in tuning.WEIGHT_FORMS


def test_budget_keys_are_apart_and_round_trip(cache_dir, monkeypatch):
    """A key whose budget holds a widened copy is its own (int8+widened), and
    a stored widened choice reads back as it was written."""
    kern = _widening_kernel()
    m, n, k = SHAPE
    with pytest.warns(RuntimeWarning, match="dropped"):
        monkeypatch.setattr(tuning, "_verify_hook", _prefer_widened(kern))
        widened = tuning.choice_for(np.dtype(np.float32), m, n, k, 1, memory_budget=1 << 30)
    monkeypatch.setattr(tuning, "_verify_hook", None)
    assert widened.weight_form == "widened" and widened.kernel == kern.name
    packed = tuning.choice_for(np.dtype(np.float32), m, n, k, 1)
    assert packed.weight_form == "packed"
    entries = json.loads((cache_dir / "tune.json").read_text())["entries"]
    assert sorted(e["key"][7] for e in entries) == ["int8", "int8+widened"]
    # a packed choice is written as before the weight form existed
    assert {e["key"][7]: "weight_form" in e["choice"] for e in entries} == \
        {"int8": False, "int8+widened": True}
    tuning.clear()
    calls = _count_tunings(monkeypatch)
    assert tuning.choice_for(np.dtype(np.float32), m, n, k, 1, memory_budget=1 << 30) == widened
    assert calls == []


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_layer_on_its_widened_copy_gives_the_packed_bits(monkeypatch, dtype):
    """When the tuner picks the widened copy, the layer makes it once, within
    its budget, counts it in nbytes, and returns the bits of the packed
    weight (the kernel sums in the order of its packed twin)."""
    kern = _widening_kernel(dtype)
    rng = np.random.default_rng(3)
    m, n, k = SHAPE
    w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    s = rng.uniform(0.01, 0.1, n).astype(dtype)
    x = rng.standard_normal((m, k)).astype(dtype)
    size = qkern.dispatch.widened_nbytes(kern, n, k)
    layer = qkern.WoqLinear(w, s, memory_budget=size)
    small = qkern.WoqLinear(w, s, memory_budget=size - 1)
    want = layer(x, num_threads=1)
    base = layer.nbytes
    monkeypatch.setattr(tuning, "_ENV", "1")
    monkeypatch.setattr(tuning, "_verify_hook", _prefer_widened(kern))
    with pytest.warns(RuntimeWarning, match="dropped"):
        got = layer(x, num_threads=1)
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))
    assert layer.widened_nbytes == size and layer.nbytes == base + size
    assert np.array_equal(layer(x, num_threads=1).view(np.uint8), want.view(np.uint8))
    assert layer.widened_nbytes == size  # one copy, made once
    monkeypatch.setattr(tuning, "_verify_hook", None)
    assert np.array_equal(small(x, num_threads=1).view(np.uint8), want.view(np.uint8))
    assert small.widened_nbytes == 0
    clone = pickle.loads(pickle.dumps(layer))
    assert clone.memory_budget == size and clone.widened_nbytes == 0


def test_tuned_choices_of_two_copies_keep_the_first(monkeypatch):
    """Tuned choices of two kernels that read widened copies, alternating
    with M, within a budget that holds both: the layer keeps the first copy
    (made once), the other kernel widens per chunk, and each gives the bits
    of its forced, copy-less run."""
    dtype = "bfloat16"
    layout = qkern.dispatch.choose_kernel(qkern.bench.DTYPES[dtype], 1).layout
    two = [kern for kern in qkern.kernels() if kern.available and kern.reads_widened_copy
           and dtype in kern.dtypes and kern.layout == layout][:2]
    if len(two) < 2:
        pytest.skip("fewer than two kernels here read a widened copy of one layout")
    rng = np.random.default_rng(5)
    m, n, k = SHAPE
    w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    s = rng.uniform(0.01, 0.1, n).astype(qkern.bench.DTYPES[dtype])
    x = rng.standard_normal((2 * m, k)).astype(qkern.bench.DTYPES[dtype])
    budget = sum(qkern.dispatch.widened_nbytes(kern, n, k) for kern in two)
    layer = qkern.WoqLinear(w, s, memory_budget=budget)
    by_rows = {m: two[0], 2 * m: two[1]}
    want = {rows: qkern.WoqLinear(w, s, kernel=kern.name)(x[:rows], num_threads=1)
            for rows, kern in by_rows.items()}

    def choice_for(dtype, rows, *args, **kwargs):
        return tuning.Choice(by_rows[rows].name, by_rows[rows].blocking, 1, 1.0, 1.0,
                             by_rows[rows].name, 1, 0.0, "widened")

    widenings = []
    real_widened = qkern.packing.PackedWeight.widened
    monkeypatch.setattr(qkern.packing.PackedWeight, "widened",
                        lambda self, kern: widenings.append(kern.name) or real_widened(self, kern))
    monkeypatch.setattr(tuning, "_ENV", "1")
    monkeypatch.setattr(tuning, "choice_for", choice_for)
    for _ in range(3):
        for rows in by_rows:
            got = layer(x[:rows], num_threads=1)
            assert np.array_equal(got.view(np.uint8), want[rows].view(np.uint8)), rows
    assert widenings == [two[0].name]
    assert layer.widened_nbytes == qkern.dispatch.widened_nbytes(two[0], n, k)


def test_memory_budget_is_checked():
    w, s = np.ones((3, 5), np.int8), np.ones(3, np.float32)
    with pytest.raises(ValueError, match="memory_budget"):
        qkern.WoqLinear(w, s, memory_budget=-1)
    with pytest.raises(TypeError, match="memory_budget"):
        qkern.WoqLinear(w, s, memory_budget=1.5)
    with pytest.raises(TypeError, match="memory_budget"):
        qkern.tune([(1, 3, 5)], memory_budget="1G")


def test_cli_tune_with_a_memory_budget_shows_both_forms(capsys):
    assert main(["tune", "--shapes", "96x80", "--m", "3", "--dtypes", "float32",
                 "--threads", "1", "--memory-budget", "1M"]) == 0
    out = capsys.readouterr().out
    assert "without widened copy" in out and "with / without" in out and "copy MiB" in out
    (row,) = [line for line in out.splitlines() if line.startswith("float32")]
    ratio = float(row.split()[-2])
    assert 0 < ratio < 100


def test_cli_memory_budget_takes_units():
    from qkern.__main__ import _bytes_arg

    assert [_bytes_arg(t) for t in ("0", "4096", "64k", "512M", "2G")] == \
        [0, 4096, 64 << 10, 512 << 20, 2 << 30]
    for bad in ("-1", "1T", "lots", ""):
        with pytest.raises(Exception, match="expected bytes"):
            _bytes_arg(bad)


def test_a_forced_widening_kernel_runs_on_a_copy_that_fits():
    """kernel= a kernel on widened panels: a widened copy when the budget
    holds it, else chunk-by-chunk widening; the same bits either way."""
    kern = _widening_kernel()
    rng = np.random.default_rng(4)
    m, n, k = SHAPE
    w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    s = rng.uniform(0.01, 0.1, n).astype(np.float32)
    x = rng.standard_normal((m, k)).astype(np.float32)
    size = qkern.dispatch.widened_nbytes(kern, n, k)
    roomy = qkern.WoqLinear(w, s, kernel=kern.name, memory_budget=size)
    tight = qkern.WoqLinear(w, s, kernel=kern.name, memory_budget=size - 1)
    assert np.array_equal(roomy(x).view(np.uint8), tight(x).view(np.uint8))
    assert roomy.widened_nbytes == size and tight.widened_nbytes == 0


def test_threads_calling_a_layer_share_one_widened_copy():
    """Calls from several threads at once make the copy once and all get
    the bits of the packed weight."""
    kern = _widening_kernel()
    rng = np.random.default_rng(5)
    n, k = 160, 96
    w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    s = rng.uniform(0.01, 0.1, n).astype(np.float32)
    xs = [rng.standard_normal((9, k)).astype(np.float32) for _ in range(8)]
    want = [qkern.WoqLinear(w, s, kernel=kern.name)(x).view(np.uint8) for x in xs]
    layer = qkern.WoqLinear(w, s, kernel=kern.name,
                            memory_budget=qkern.dispatch.widened_nbytes(kern, n, k))
    made = []
    real = layer._weight.widened

    def counting(kernel):
        made.append(kernel.name)
        return real(kernel)

    layer._weight.widened = counting
    start = threading.Barrier(len(xs))
    got = [None] * len(xs)

    def call(i):
        start.wait()
        got[i] = layer(xs[i], num_threads=1).view(np.uint8)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert made == [kern.name]
    assert all(np.array_equal(g, e) for g, e in zip(got, want))


def test_avx512_bf16_candidates_include_the_avx512_kernels(monkeypatch):
    """On an AVX-512-BF16 CPU the tuner times the AVX-512 FMA kernels
    beside the vdpbf16ps ones (tuning.TUNED_WITH), on an AMX CPU both
    beside the tile kernels, on the same packed layout; no other level
    joins, and no other static level gains any. Every compiled kernel is
    made available, as on such a CPU."""
    import dataclasses

    monkeypatch.setattr(qkern.dispatch, "REGISTRY",
                        [dataclasses.replace(k, available=True) for k in qkern.dispatch.REGISTRY])
    int8, int4 = qkern.dispatch.INT8, qkern.dispatch.INT4

    def names(dtype, layout, isa, fmt):
        return {k.name for k in tuning._kernels(dtype, layout, isa, fmt)}

    assert names("bfloat16", (32, 2), "avx512_bf16", int8) == {
        k.name for k in qkern.dispatch.REGISTRY if k.layout == (32, 2) and k.kind == "panels"
        and k.isa in ("avx512", "avx512_bf16") and k.weight_format == int8}
    assert {"bf16_gemm_8x32c2__avx512bf16", "f32_gemm_6x32c2__avx512"} <= names(
        "bfloat16", (32, 2), "avx512_bf16", int8)
    assert names("bfloat16", (32, 1), "avx512_bf16", int4) == {
        "bf16_qb4w_gemm_8x32c1__avx512bf16", "f32_qb4w_gemm_8x32c1__avx512",
        "f32dq_qb4w_gemm_8x32c1__avx512"}
    if any(k.isa == "amx" for k in qkern.dispatch.REGISTRY):  # the compiler built AMX
        assert names("bfloat16", (32, 1), "amx", int4) == {
            "bf16_qb4w_gemm_8x32c1__avx512bf16", "f32_qb4w_gemm_8x32c1__avx512",
            "f32dq_qb4w_gemm_8x32c1__avx512", "tile_qb4w_gemm_32x32c1__amx",
            "tilew_qb4w_gemm_32x32c1__amx"}
        assert names("float32", (32, 1), "amx", int4) == {
            "f32_qb4w_gemm_8x32c1__avx512", "f32dq_qb4w_gemm_8x32c1__avx512",
            "tile_qb4w_gemm_32x32c1__amx", "tilew_qb4w_gemm_32x32c1__amx"}
        assert names("bfloat16", (32, 2), "amx", int8) == {
            k.name for k in qkern.dispatch.REGISTRY if k.layout == (32, 2)
            and k.isa not in ("ref", "avx2") and k.weight_format == int8}
    assert names("float32", (32, 2), "avx512", int8) == {
        "f32_gemm_1x32c2__avx512", "f32_gemm_4x32c2__avx512", "f32_gemm_6x32c2__avx512",
        "f32w_gemm_6x32c2__avx512"}
    assert names("bfloat16", (16, 1), "avx2", int8) == {
        "f32_gemm_1x16c1__avx2", "f32_gemm_4x16c1__avx2", "f32_gemm_6x16c1__avx2",
        "f32w_gemm_6x16c1__avx2"}
