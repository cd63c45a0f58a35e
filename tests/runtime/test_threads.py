"""Threads: a forked child, a thread count beyond the cores, and threads the
OS cannot start (include/qkern/threads.h, docs/reliability.rst).

Each case runs in a process of its own with a timeout: before these were
handled, a forked child hung for ever, and a failed thread start ended the
process from inside libgomp.
"""

import os

import pytest

from process_support import asan_loaded, run_python

# One row over 2048 x 2048 is enough work for two threads; `want` (`want_fn`)
# is the layer's (the functional op's) single-threaded result, which every
# thread count must reproduce bit for bit.  The two may differ: with few
# rows the functional op runs a kernel on the unpacked weight, which sums
# in another order (docs/semantics.rst, "Determinism").
SETUP = """
    import os, resource, sys, warnings
    import numpy as np, qkern
    rng = np.random.default_rng(5)
    w = rng.integers(-128, 128, (2048, 2048), dtype=np.int8)
    scales = rng.uniform(0.5, 2, 2048).astype(np.float32)
    layer = qkern.WoqLinear(w, scales)
    x = rng.standard_normal((3, 2048)).astype(np.float32)
    want = layer(x, num_threads=1)
    want_fn = qkern.weight_int8pack_mm(x, w, scales, num_threads=1)

    def same(y):
        return y.tobytes() == want.tobytes()

    def same_fn(y):
        return y.tobytes() == want_fn.tobytes()

    def thread_count():
        return len(os.listdir("/proc/self/task"))

    warnings.simplefilter("always")
"""


# libgomp's (and qkern's probe's) thread stack, set so that the
# address-space limits below leave room for a known number of them.
STACK_MIB = 4
PROCS = len(os.sched_getaffinity(0))
two_processors = pytest.mark.skipif(PROCS < 2, reason="needs two processors")


def _run(body: str, timeout: float = 120):
    proc = run_python(SETUP + body, timeout=timeout, env={"OMP_STACKSIZE": f"{STACK_MIB}M"})
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    return proc


@two_processors
def test_forked_child_runs_on_one_thread_and_warns_once():
    """After the parent ran two threads, a child's threaded calls used to
    wait for ever on libgomp's pool, which does not survive fork."""
    _run("""
    assert same(layer(x, num_threads=2))
    pid = os.fork()
    if pid == 0:
        with warnings.catch_warnings(record=True) as caught:
            ok = same(layer(x, num_threads=2)) and same(layer(x))
            ok = ok and same_fn(qkern.weight_int8pack_mm(x, w, scales, num_threads=2))
        messages = [str(c.message) for c in caught]
        ok = ok and len(messages) == 1 and "forked" in messages[0]
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child's results or warning were wrong"
    assert same(layer(x, num_threads=2))  # the parent keeps its threads
    """)


def test_multiprocessing_fork_pool():
    _run("""
    import multiprocessing

    def call(seed):
        return layer(x, num_threads=2).tobytes()

    assert same(layer(x, num_threads=2))
    with multiprocessing.get_context("fork").Pool(2) as pool:
        results = pool.map(call, range(4))
    assert all(r == want.tobytes() for r in results)
    """)


def test_child_forked_before_any_threads_keeps_them():
    """Only a child of a parent that ran threads loses its pool: one forked
    before keeps its threads, with no warning."""
    _run("""
    pid = os.fork()
    if pid == 0:
        with warnings.catch_warnings(record=True) as caught:
            ok = same(layer(x, num_threads=2))
        ok = ok and not caught and thread_count() == min(2, len(os.sched_getaffinity(0)))
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    """)


def test_num_threads_capped_at_the_processors():
    """num_threads=600 on a machine with a few cores started 600 threads."""
    _run("""
    procs = len(os.sched_getaffinity(0))
    before = thread_count()
    with warnings.catch_warnings(record=True) as caught:
        assert same(layer(x, num_threads=600))
        assert same_fn(qkern.weight_int8pack_mm(x, w, scales, num_threads=600))
    assert not caught, [str(c.message) for c in caught]
    assert thread_count() - before <= procs - 1, (before, thread_count(), procs)
    """)


needs_plain_allocator = pytest.mark.skipif(
    asan_loaded(), reason="AddressSanitizer reserves terabytes of address space and "
                          "aborts when a mapping fails, so an address-space limit tests it")


def _limit_address_space(headroom_mib: int) -> str:
    return f"""
    vm = int(next(l.split()[1] for l in open("/proc/self/status") if l.startswith("VmSize")))
    limit = (vm << 10) + ({headroom_mib} << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    """


@needs_plain_allocator
def test_num_threads_600_under_an_address_space_limit():
    """The issue's case: 600 threads under a limit that leaves room for a
    few (a stack per processor and more) ended the process with
    'libgomp: Thread creation failed'."""
    _run(_limit_address_space(32 + 2 * PROCS * STACK_MIB) + """
    with warnings.catch_warnings(record=True) as caught:
        assert same(layer(x, num_threads=600))
    assert not caught, [str(c.message) for c in caught]
    """)


@needs_plain_allocator
@two_processors
def test_thread_the_os_cannot_start_never_ends_the_process():
    """With no room for even one more thread stack, a two-thread call runs on
    the calling thread alone, with one warning, and gives the same bits."""
    _run(_limit_address_space(2) + """
    before = thread_count()
    with warnings.catch_warnings(record=True) as caught:
        assert same(layer(x, num_threads=2)) and same(layer(x, num_threads=2))
    messages = [str(c.message) for c in caught]
    assert len(messages) == 1 and "could not start" in messages[0], messages
    assert thread_count() == before
    """)


@needs_plain_allocator
@two_processors
def test_pool_grown_when_first_asked_for_not_when_first_used():
    """A first call that asks for two threads but has work for one (16 x 16)
    grows the pool to two at once, while the OS can start the thread: a
    later call that uses both then starts none, even after a Python thread
    took the freed stack and the address space has no room left for
    another (it ended the process inside libgomp)."""
    _run((f"""
    import threading
    small = qkern.WoqLinear(np.ones((16, 16), np.int8), np.ones(16, np.float32))
    small(np.ones((1, 16), np.float32), num_threads=2)
    done = threading.Event()
    threading.stack_size({STACK_MIB} << 20)  # takes the stack the probe freed
    waiter = threading.Thread(target=done.wait)
    waiter.start()
    """) + _limit_address_space(2) + """
    with warnings.catch_warnings(record=True) as caught:
        assert same(layer(x, num_threads=2))
    assert not caught, [str(c.message) for c in caught]
    done.set()
    waiter.join()
    """)
