"""A deliberate out-of-bounds write by a real kernel, to prove that a memory
checker is watching qkern's code (``make sanitize``, ``make valgrind``).

Calls the C driver through the thin Cython layer (``qkern._woq.gemm``,
which by design checks nothing) with an output buffer one element short:
the last row's last element lands past the end of the allocation.  Under
AddressSanitizer or valgrind memcheck the process must report it; if it
does not, the checker is not seeing what the kernels do.  Run plainly it
may well finish without a sign, which is why the checks exist.
"""

import numpy as np

from qkern import _woq
from qkern._dtypes import dtype_code
from qkern.dispatch import choose_kernel
from qkern.packing import PackedWeight
from qkern.woq import _padded_f32

M, N, K = 8, 64, 32

kern = choose_kernel(np.float32, M)
x = np.ones((M, K), np.float32)
packed = PackedWeight(np.ones((N, K), np.int8), kern.layout).data
scale = _padded_f32(np.ones(N, np.float32), kern.nr)
y = np.empty(M * N - 1, np.float32)
print(f"oob_canary: {kern.name} writes {M}x{N} float32 into {y.size} elements", flush=True)
_woq.gemm(kern.index, x, M, N, K, dtype_code(x.dtype), K * 4, None, packed, scale, None, y, N * 4,
          1, None)
print("oob_canary: the write past the end went unreported", flush=True)
