"""Thin Cython layer over the roofline probes (include/qkern/roofline.h)."""
cimport numpy as cnp
from libc.stdint cimport uint64_t

from qkern._clib cimport qk_num_peak_loops, qk_peak_loops, qk_peak_run, qk_read_run

cnp.import_array()


def peak_loops():
    """The peak loops built: list of (name, isa level, flops per iteration)."""
    cdef size_t i
    return [(qk_peak_loops[i].name.decode(), <int>qk_peak_loops[i].isa,
             qk_peak_loops[i].flops_per_iter) for i in range(qk_num_peak_loops)]


def peak_run(size_t index, size_t iters, int threads):
    """Seconds for ``iters`` iterations of peak loop ``index`` on each of ``threads`` threads."""
    if index >= qk_num_peak_loops or threads < 1:
        raise ValueError("no such peak loop, or threads < 1")
    cdef double t
    with nogil:
        t = qk_peak_run(index, iters, threads)
    return t


def read_run(cnp.ndarray buf, int threads):
    """Seconds to read all of ``buf`` (64-byte aligned, size a multiple of 64) once."""
    cdef uint64_t checksum = 0
    cdef const void* p = cnp.PyArray_DATA(buf)
    cdef size_t nbytes = buf.nbytes
    if (<size_t>p) % 64 or nbytes % 64 or threads < 1:
        raise ValueError("buffer must be 64-byte aligned with a size that is a multiple of 64")
    cdef double t
    with nogil:
        t = qk_read_run(p, nbytes, threads, &checksum)
    return t
