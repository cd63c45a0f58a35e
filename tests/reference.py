"""NumPy float64 reference for the int8 WoQ GEMM and its error bound.

Error analysis (u = 2**-24, the unit roundoff of fp32)
------------------------------------------------------
Let S = sum_k |x_k * w_k| over the *dtype-rounded* inputs, s the scale, b the
bias, and y* = (sum_k x_k w_k) * s + b evaluated exactly (float64 is exact
enough: every product has <= 24 + 8 significant bits and K is small).

1. Products.  A bf16 or fp16 x times an int8 w is exact in fp32 (at most
   8 + 8 resp. 11 + 8 significant bits).  An fp32 x times w is rounded once
   (relative u) unless the kernel fuses it into an FMA.
2. Accumulation of K terms in fp32, in any order (sequential, two partial
   sums per column, a vdpbf16ps pair tree):  |acc - sum| <= gamma_{K+1} * S,
   gamma_n = n u / (1 - n u); the extra +1 covers step 1 for fp32 x.
3. Epilogue.  t = fl(acc * s) adds u |acc s|; v = fl(t + b) adds u |t + b|.
   With |acc| <= S (1 + gamma), both are <= u (|s| S + |b|) up to O(u^2),
   so |v - y*| <= (gamma_{K+1} + 2u) |s| S + u |b|, times (1 + 4u) for the
   second-order terms.
4. One rounding to the output dtype: at most u_out |v| (u_out = 2**-8 for
   bf16, 2**-11 for fp16, 0 for fp32) in the normal range, plus half the
   smallest subnormal of that dtype below it.
5. vdpbf16ps and AMX tdpbf16ps (kernels named bf16*) treat subnormal bf16
   inputs as zero and flush subnormal results (DAZ/FTZ): each of the K
   products loses at most 2**-126 * 128 and each of the <= K steps at most
   2**-126, i.e. an absolute (1 + gamma_{K+2}) K * 129 * 2**-126 * |s| more
   (carried through the later roundings).

A sum within its error bound of zero (|sum| <= gamma_{K+1} S, plus
K * 129 * 2**-126 for those kernels) may come out as exactly 0: by
cancellation, or by the flush when every product is that small.  An
infinite scale then gives NaN (0 * inf) where y* is +-inf
(`woq_sum_may_vanish`).

Outside the output dtype's finite range the result is +-inf (or NaN from
inf - inf), as IEEE arithmetic gives; `assert_woq_close` accepts inf only
where y* is within the bound of overflowing.

6. fp32 overflow of an intermediate.  Every partial sum of the finite
   products is at most S_f (1 + gamma) in magnitude (S_f: S over the finite
   x and s), and acc * s at most |s| S_f (1 + gamma) (1 + u).  Where either
   reaches the fp32 overflow threshold, some summation order may
   overflow to +-inf, and a later inf - inf, inf * 0 (a zero scale) or
   inf + bias of the other sign gives NaN: there (`woq_may_overflow`) the
   result may be +-inf or NaN whatever y* is.  A finite result still obeys
   the bound: once infinite, no step comes back to a finite value.
7. A kernel that splits f16/f32 x into P bf16 planes (P = 2 or 3, sum exact,
   each plane truncated so sum_p |x_p| <= |x| (1 + 2**-7 + 2**-14)) sums P*K
   exact products: steps 2, 5 and 6 hold with P*K terms in place of K and S
   grown by that factor.
"""

from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = (np.dtype(np.float32), np.dtype(np.float16), BF16)


def first_dtype(kern) -> np.dtype:
    """The first of DTYPES that kernel ``kern`` takes (bfloat16 alone, for some)."""
    return next(d for d in DTYPES if d.name in kern.dtypes)

U32 = 2.0**-24
U_OUT = {np.dtype(np.float32): 0.0, np.dtype(np.float16): 2.0**-11, BF16: 2.0**-8}
HALF_MIN_SUBNORMAL = {np.dtype(np.float32): 2.0**-150, np.dtype(np.float16): 2.0**-25,
                      BF16: 2.0**-134}
F32_MAX = float(np.finfo(np.float32).max)
MAX_FINITE = {np.dtype(np.float32): float(np.finfo(np.float32).max),
              np.dtype(np.float16): 65504.0, BF16: float(ml_dtypes.finfo(BF16).max)}


def woq_reference(x, w, scales, bias=None):
    """Exact y* = (x @ w.T) * scales + bias in float64 (shape (..., N))."""
    x64 = np.asarray(x).astype(np.float64)
    acc = x64 @ np.asarray(w).astype(np.float64).T
    y = acc * np.asarray(scales).astype(np.float64)
    if bias is not None:
        y = y + np.asarray(bias).astype(np.float64)
    return y


def _abs_sum(x, w, planes: int = 1):
    """S = sum_k |x_k * w_k| (elementwise over the result) and gamma_{P*K+1},
    for P planes per activation (step 7 of the module docstring)."""
    k = np.asarray(w).shape[1] * planes
    big_s = np.abs(np.asarray(x).astype(np.float64)) @ np.abs(np.asarray(w).astype(np.float64)).T
    if planes > 1:
        big_s = big_s * (1 + 2.0**-7 + 2.0**-14)
    return big_s, (k + 1) * U32 / (1 - (k + 1) * U32)


def woq_may_overflow(x, w, scales, planes: int = 1):
    """Where an fp32 intermediate may overflow (step 6 of the module docstring)."""
    x64 = np.asarray(x).astype(np.float64)
    big_s, gamma = _abs_sum(np.where(np.isfinite(x64), x64, 0.0), w, planes)
    s = np.abs(np.asarray(scales).astype(np.float64))
    s = np.where(np.isfinite(s), s, 0.0)
    with np.errstate(over="ignore"):
        return ((big_s * (1 + gamma) >= F32_MAX)
                | (big_s * s * (1 + gamma) * (1 + U32) >= F32_MAX))


def woq_sum_may_vanish(x, w, scales, daz: bool, planes: int = 1):
    """Where the fp32 sum may be exactly 0 before an infinite scale, so that
    the result may be NaN where y* is +-inf (see the module docstring)."""
    k = np.asarray(w).shape[1] * planes
    big_s, gamma = _abs_sum(x, w, planes)
    exact = np.asarray(x).astype(np.float64) @ np.asarray(w).astype(np.float64).T
    slack = gamma * big_s + (k * 129 * 2.0**-126 if daz else 0.0)
    return (np.abs(exact) <= slack) & np.isinf(np.asarray(scales).astype(np.float64))


def woq_bound(x, w, scales, bias, dtype, daz: bool, planes: int = 1):
    """Elementwise bound on |y - y*| from the analysis in the module docstring."""
    dtype = np.dtype(dtype)
    k = np.asarray(w).shape[1] * planes
    s = np.abs(np.asarray(scales).astype(np.float64))
    big_s, gamma = _abs_sum(x, w, planes)
    b = 0.0 if bias is None else np.abs(np.asarray(bias).astype(np.float64))
    gamma_k2 = (k + 2) * U32 / (1 - (k + 2) * U32)
    daz_term = (1 + gamma_k2) * k * 129 * 2.0**-126 * s if daz else 0.0
    e32 = ((gamma + 2 * U32) * s * big_s + U32 * b + daz_term) * (1 + 4 * U32)
    y_abs = np.abs(woq_reference(x, w, scales, bias))
    return e32 + U_OUT[dtype] * (y_abs + e32) + HALF_MIN_SUBNORMAL[dtype]


def assert_woq_close(y, x, w, scales, bias=None, *, daz=False, planes=1):
    """Assert y (dtype of x) is within `woq_bound` of the exact result.

    NaN passes only where the float64 reference is NaN, where an fp32
    intermediate may overflow (`woq_may_overflow`), or where the sum may
    vanish before an infinite scale (`woq_sum_may_vanish`); inf only where the
    reference is within the bound of the dtype's overflow threshold, or
    where an fp32 intermediate may overflow.
    """
    dtype = np.dtype(np.asarray(x).dtype)
    assert y.dtype == dtype, (y.dtype, dtype)
    with np.errstate(invalid="ignore", over="ignore"):  # inf and NaN inputs are meant
        ref = woq_reference(x, w, scales, bias)
        tol = woq_bound(x, w, scales, bias, dtype, daz, planes)
        overflow = woq_may_overflow(x, w, scales, planes)
        vanish = woq_sum_may_vanish(x, w, scales, daz, planes)
    assert y.shape == ref.shape, (y.shape, ref.shape)
    y64 = y.astype(np.float64)
    ref_nan = np.isnan(ref)
    y_nan = np.isnan(y64)
    assert not (ref_nan & ~y_nan).any(), "a number where the reference is NaN"
    assert not (y_nan & ~ref_nan & ~overflow & ~vanish).any(), "NaN where the reference has none"
    # y* is infinite only through an infinite input, which no fp32 step can
    # bring back to a finite value
    assert not (np.isinf(ref) & np.isfinite(y64)).any(), \
        "a finite number where the reference is infinite"
    _assert_numbers_within(y64, ref, tol, overflow, dtype)


def _assert_numbers_within(y64, ref, tol, overflow, dtype):
    """y64's numbers within ``tol`` of ``ref`` where that is not NaN; an
    infinity only where an fp32 intermediate may overflow or the exact
    result is infinite or within the bound of the dtype's overflow
    threshold, with its sign where the bound fixes that sign."""
    ref_nan = np.isnan(ref)
    finite = np.isfinite(y64) & ~ref_nan
    err = np.abs(y64[finite] - ref[finite])
    bad = err > tol[finite]
    assert not bad.any(), (
        f"{bad.sum()} of {bad.size} elements outside the bound; worst excess "
        f"{(err - tol[finite]).max():.3g}, at ref {ref[finite][np.argmax(err - tol[finite])]!r}")
    inf = np.isinf(y64) & ~ref_nan & ~overflow
    if inf.any():
        ref_inf, tol_inf = ref[inf], tol[inf]
        with np.errstate(invalid="ignore"):
            reachable = np.isinf(ref_inf) | (np.abs(ref_inf) + tol_inf >= MAX_FINITE[dtype])
            sign_ok = (np.sign(y64[inf]) == np.sign(ref_inf)) | (np.abs(ref_inf) <= tol_inf)
        assert reachable.all(), "inf where the exact result is far from overflow"
        assert sign_ok.all(), "inf of the wrong sign"


# int4 groupwise (include/qkern/woq.h, docs/semantics.rst)
# -------------------------------------------------------
# With s, z the dtype-rounded scales and zeros as reals, z' = z - 8 s, G
# groups of g k each, per output:
#   y* = sum_grp (s * sum_k x_k q_k + z' * sum_k x_k) + b   (exactly).
# The kernels compute, in fp32: p = the FMA chain of x_k * q_k over a group
# (each step one rounding: |p - P| <= gamma_g * sum |x_k| q_k), xs = the sum
# of x_k over the group (|xs - XS| <= gamma_g * sum |x_k|), z' rounded once
# (relative u), then 2G FMAs acc = fma(p, s, acc), acc = fma(xs, z', acc),
# each rounding once; then + b (one rounding) and the rounding to dtype.
# Each term passes through at most g + 2G + 1 roundings, so
#   |v - y*| <= gamma_{g + 2G + 2} * (T + |b|)
#               + (1 + gamma_{g + 2G + 2}) (2G + 1) 2**-150,
#   T = sum_grp (|s| sum_k |x_k| q_k + |z'| sum_k |x_k|),
# the last term for the 2G FMAs and the bias add, each of which may round
# in fp32's subnormal range (absolute error up to half its spacing, 2**-150;
# the products x_k q_k and the sums of them are multiples of x's spacing and
# exact there), grown by the later roundings; each absolute term below
# grows by the same factor. The final rounding adds u_out |v| and half a
# subnormal, as for int8.
# A kernel summing p with vdpbf16ps (bf16_qb4w, flushes_subnormals) takes
# subnormal x_k as zero (each product then off by at most 15 * 2**-126) and
# flushes a subnormal p (each of the g steps off by at most 2**-126 more):
# p is off by g * 16 * 2**-126 more per group, so y by |s| times that,
#   + 16 * g * 2**-126 * sum_grp |s|   (daz).
# A kernel summing p over P bf16 planes of x (tile_qb4w: P = 2 for f16, 3
# for f32, each plane truncated, sum exact, sum_p |x_pk| <= |x_k| (1 +
# 2**-7 + 2**-14)) sums P g exact products in its own order: P g in place
# of g in the roundings and the flushes above, and the x_k q_k part of T
# grown by that factor (step 7 of the int8 analysis).
# A kernel summing a high nibble's p from byte sums (f32_qb4w, byte_sums):
# for column j + 16 of a panel, p = (pb - plo) * 2**-4, pb the FMA chain of
# x_k b_k (b_k = 16 q_k + q'_k, the whole byte, exact in fp32; q' the low
# nibble, column j) and plo column j's chain: |pb - PB| <= gamma_g sum
# |x_k| b_k and |plo - PLO| <= gamma_g sum |x_k| q'_k, the subtraction one
# more rounding, so |p - P| <= gamma_{g+1} sum |x_k| (q_k + q'_k / 8), and
# the product by 2**-4 is exact but in the subnormal range (2**-150 more,
# times |s| in acc): q_k + q'_k / 8 in place of q_k in T for the high
# nibbles, g + 1 in place of g in the roundings, + 2**-150 sum_grp |s|.
# A kernel on dequantized weights (f32dq_qb4w, dequantized) sums no groups:
# w^ = fma(q, s, z'^) with z'^ = z' rounded once, so
# |w^ - w| <= (2u + u^2)(q |s| + |z'|) + 3 * 2**-150, then one FMA chain of
# K steps, |acc - sum x_k w^_k| <= gamma_K sum |x_k| |w^_k|
# + K (1 + gamma_K) 2**-150 (each step may round in the subnormal range,
# its products not being multiples of x's spacing, and the later steps
# grow that error by at most 1 + gamma_K), then + b: with
# (1 + gamma_K)(1 + u)^2 <= 1 + gamma_{K+2},
#   |v - y*| <= gamma_{K + 3} * (T + |b|) + (K + 1)(1 + gamma_K) 2**-150
#               + 4 * 2**-150 * sum_k |x_k|,
# the same T; the bound takes the larger step count of the two analyses
# and both absolute terms, so that it covers either compute.
# fp32 overflow of an intermediate (step 6 of the int8 analysis): every
# partial sum of a group's p chain is at most sum |x_k| q_k (grown by the
# planes' factor; sum |x_k| b_k for a chain of whole bytes), of xs at most
# sum |x_k|, |z'| at most 8 |s| + |z|, |w^| at most q |s| + |z'|, and every
# partial sum of acc, with the bias, at most T + |b|, each times (1 +
# gamma) (1 + u) for its roundings.  Where one of these reaches the fp32
# overflow threshold (`int4_may_overflow`) the result may be +-inf or NaN
# (inf - inf: a whole bytes' sum less its overflowed low nibbles' sum, or
# two groups overflowing with opposite signs) whatever y* is: a small scale
# against a large x overflows p where y* is finite.  A finite result still
# obeys the bound.


def int4_dequantize(q, sz, group_size):
    """W[n, k] = (q[n, k] - 8) * s[g, n] + z[g, n] in float64 (shape (N, K))."""
    s = np.repeat(np.asarray(sz[..., 0]).astype(np.float64).T, group_size, axis=1)
    z = np.repeat(np.asarray(sz[..., 1]).astype(np.float64).T, group_size, axis=1)
    return (np.asarray(q).astype(np.float64) - 8) * s + z


def int4_reference(x, q, sz, group_size, bias=None):
    """Exact y* = x @ W.T + bias in float64 (shape (..., N))."""
    y = np.asarray(x).astype(np.float64) @ int4_dequantize(q, sz, group_size).T
    return y if bias is None else y + np.asarray(bias).astype(np.float64)


def _round_f32(v: Fraction) -> Fraction:
    """v rounded to the nearest float32, ties to even, subnormals kept
    (for values below float32's overflow; a zero comes out +0)."""
    if v == 0:
        return Fraction(0)
    a = abs(v)
    e = a.numerator.bit_length() - a.denominator.bit_length()  # 2**(e-1) < a < 2**(e+1)
    if a < Fraction(2) ** e:
        e -= 1  # now 2**e <= a < 2**(e+1)
    quantum = Fraction(2) ** (max(e, -126) - 23)
    units = a / quantum
    whole, rest = divmod(units.numerator, units.denominator)
    if 2 * rest > units.denominator or (2 * rest == units.denominator and whole % 2):
        whole += 1
    return (whole if v > 0 else -whole) * quantum


def int4_byte_sums_model(x, q, sz, group_size, bias=None):
    """The bits of compute ``f32_qb4w`` (include/qkern/woq.h), in exact
    rationals rounded to float32 step by step: per group, the FMA chain of
    x_k q_k for a low nibble (column n % 32 < 16); for a high nibble,
    (the chain of x_k b_k - the chain of its low nibble's x_k q'_k) * 2**-4,
    b_k = 16 q_k + q'_k the whole byte, q' column n - 16; xs the chain of
    adds of x_k; then z' = fma(-8, s, z), acc = fma(p, s, acc), acc =
    fma(xs, z', acc) group by group, acc + bias, then y in x's dtype.
    Slow: for small problems.  A sum that rounds to zero comes out +0, so
    the inputs should keep every partial sum away from the underflow
    range."""
    x = np.asarray(x)
    q = np.asarray(q)
    s = np.asarray(sz[..., 0]).astype(np.float32)
    z = np.asarray(sz[..., 1]).astype(np.float32)
    n, k = q.shape

    def chain(row, values):
        acc = Fraction(0)
        for xk, v in zip(row, values):
            acc = _round_f32(xk * int(v) + acc)
        return acc

    groups = [slice(g * group_size, (g + 1) * group_size) for g in range(k // group_size)]
    y = np.empty((x.shape[0], n), np.float32)
    for i, row in enumerate(x.astype(np.float32)):
        xr = [Fraction(float(v)) for v in row]
        xs = [Fraction(0)] * len(groups)  # each group's chain of adds, once per row
        for g, ks in enumerate(groups):
            for xk in xr[ks]:
                xs[g] = _round_f32(xs[g] + xk)
        acc = [Fraction(0)] * n
        for g, ks in enumerate(groups):
            p = [None] * n  # a high nibble's column j reuses column j - 16's p
            for j in range(n):
                if j % 32 < 16:
                    p[j] = chain(xr[ks], q[j, ks])
                else:
                    byte = 16 * q[j, ks].astype(np.int64) + q[j - 16, ks]
                    p[j] = _round_f32(_round_f32(chain(xr[ks], byte) - p[j - 16]) / 16)
                sj, zj = Fraction(float(s[g, j])), Fraction(float(z[g, j]))
                acc[j] = _round_f32(p[j] * sj + acc[j])
                acc[j] = _round_f32(xs[g] * _round_f32(-8 * sj + zj) + acc[j])
        for j in range(n):
            if bias is not None:
                acc[j] = _round_f32(acc[j] + Fraction(float(np.float32(bias[j]))))
            y[i, j] = np.float32(float(acc[j]))
    return y.astype(x.dtype)


def int4_dequantized_model(x, q, sz, group_size, bias=None):
    """The bits of compute ``f32dq_qb4w`` (include/qkern/woq.h), in exact
    rationals rounded to float32 step by step: z' = fma(-8, s, z), w =
    fma(q, s, z'), acc = fma(x, w, acc) over k from 0 in increasing k,
    acc + bias, then y in x's dtype.  Slow: for small problems.  A sum
    that rounds to zero comes out +0 (the kernel may give -0 there), so the
    inputs should keep every partial sum away from the underflow range."""
    x = np.asarray(x)
    xs = [[Fraction(float(v)) for v in row] for row in x.astype(np.float32)]
    s = np.asarray(sz[..., 0]).astype(np.float32)
    z = np.asarray(sz[..., 1]).astype(np.float32)
    n, k = np.asarray(q).shape
    w = [[None] * k for _ in range(n)]
    for j in range(n):
        for g in range(k // group_size):
            sj, zj = Fraction(float(s[g, j])), Fraction(float(z[g, j]))
            zp = _round_f32(-8 * sj + zj)
            for kk in range(g * group_size, (g + 1) * group_size):
                w[j][kk] = _round_f32(int(q[j, kk]) * sj + zp)
    y = np.empty((x.shape[0], n), np.float32)
    for i, row in enumerate(xs):
        for j in range(n):
            acc = Fraction(0)
            for kk in range(k):
                acc = _round_f32(row[kk] * w[j][kk] + acc)
            if bias is not None:
                acc = _round_f32(acc + Fraction(float(np.float32(bias[j]))))
            y[i, j] = np.float32(float(acc))
    return y.astype(x.dtype)


def _high_nibbles(q64):
    """The columns of high nibbles (n % 32 >= 16) and the q of the low
    nibble in the same byte (column n - 16) for each."""
    high = np.arange(len(q64)) % 32 >= 16
    return high, q64[np.flatnonzero(high) - 16]


def _int4_terms(x, q, sz, group_size, planes: int, byte_sums: bool):
    """|x|, |s| and |z'| per group (groups, N), the planes' growth factor
    and T (the analysis above; with each high nibble's q'/8 where
    ``byte_sums``)."""
    x_abs = np.abs(np.asarray(x).astype(np.float64))
    s = np.abs(np.asarray(sz[..., 0]).astype(np.float64))
    zp = np.abs(np.asarray(sz[..., 1]).astype(np.float64) - 8 * np.asarray(sz[..., 0],
                                                                           np.float64))
    q64 = np.asarray(q).astype(np.float64)
    if byte_sums:  # each high nibble's column j + 16 also carries q'/8 of column j
        high, low = _high_nibbles(q64)
        q64[high] += low / 8
    growth = 1 + 2.0**-7 + 2.0**-14 if planes > 1 else 1.0
    big_t = (growth * (x_abs @ (q64 * np.repeat(s.T, group_size, axis=1)).T)
             + x_abs @ np.repeat(zp.T, group_size, axis=1).T)
    return x_abs, s, zp, growth, big_t


def int4_may_overflow(x, q, sz, group_size, bias=None, planes: int = 1,
                      byte_sums: bool = False, *, terms=None):
    """Where an fp32 intermediate of an int4 compute may overflow (the
    analysis above): finite inputs, elementwise over the result.
    ``terms``: `_int4_terms` of the same arguments, when already computed."""
    x_abs, s, zp, growth, big_t = terms or _int4_terms(x, q, sz, group_size, planes, byte_sums)
    q64 = np.asarray(q).astype(np.float64)
    chained = q64.copy()  # what a p chain multiplies x_k by: b_k for a high nibble
    if byte_sums:
        high, low = _high_nibbles(q64)
        chained[high] = 16 * q64[high] + low
    groups = len(s)
    x_g = x_abs.reshape(*x_abs.shape[:-1], groups, group_size)
    p_sums = np.einsum("...gk,ngk->...ng", x_g, chained.reshape(len(q64), groups, group_size))
    p_max = growth * p_sums.max(axis=-1, initial=0.0)
    xs_max = x_g.sum(axis=-1).max(axis=-1, initial=0.0)[..., None]
    z_max = (8 * s + np.abs(np.asarray(sz[..., 1]).astype(np.float64))).max(axis=0, initial=0.0)
    w_max = (15 * s + zp).max(axis=0, initial=0.0)
    b = 0.0 if bias is None else np.abs(np.asarray(bias).astype(np.float64))
    steps = planes * group_size * groups + 2 * groups + 4
    grown = (1 + steps * U32 / (1 - steps * U32)) * (1 + U32)
    with np.errstate(over="ignore"):
        largest = np.maximum.reduce([p_max, np.broadcast_to(xs_max, p_max.shape),
                                     np.broadcast_to(np.maximum(z_max, w_max), p_max.shape),
                                     big_t + b])
        return largest * grown >= F32_MAX


def int4_bound(x, q, sz, group_size, bias, dtype, daz: bool = False, planes: int = 1,
               dequantized: bool = False, byte_sums: bool = False, *, terms=None):
    """Elementwise bound on |y - y*| (the analysis above; ``daz``: for a
    kernel that flushes subnormals, ``planes``: bf16 planes per x,
    ``dequantized``: for a kernel on dequantized weights too,
    ``byte_sums``: for a kernel summing the high nibbles from byte sums;
    ``terms``: `_int4_terms` of the same arguments, when already computed)."""
    dtype = np.dtype(dtype)
    x_abs, s, zp, growth, big_t = terms or _int4_terms(x, q, sz, group_size, planes, byte_sums)
    groups = len(s)
    steps = planes * group_size + 2 * groups + 2 + (1 if byte_sums else 0)
    k = groups * group_size
    if dequantized:
        steps = max(steps, k + 3)
    gamma = steps * U32 / (1 - steps * U32)
    b = 0.0 if bias is None else np.abs(np.asarray(bias).astype(np.float64))
    absolute = (2 * groups + 1) * 2.0**-150
    if byte_sums:
        absolute = absolute + 2.0**-150 * s.sum(axis=0)
    if daz:
        absolute = absolute + 16 * planes * group_size * 2.0**-126 * s.sum(axis=0)
    # each absolute error carried through the later roundings of acc
    e32 = gamma * (big_t + b) + (1 + gamma) * absolute
    if dequantized:
        e32 = (e32 + (k + 1) * (1 + gamma) * 2.0**-150
               + 4 * 2.0**-150 * x_abs.sum(axis=-1, keepdims=True))
    y_abs = np.abs(int4_reference(x, q, sz, group_size, bias))
    return e32 + U_OUT[dtype] * (y_abs + e32) + HALF_MIN_SUBNORMAL[dtype]


def assert_int4_close(y, x, q, sz, group_size, bias=None, *, daz=False, planes=1,
                      dequantized=False, byte_sums=False):
    """Assert finite inputs gave y (dtype of x) within `int4_bound` of y*:
    NaN only where an fp32 intermediate may overflow (`int4_may_overflow`),
    inf there or where y* is within the bound of the dtype's overflow
    threshold."""
    dtype = np.dtype(np.asarray(x).dtype)
    assert y.dtype == dtype, (y.dtype, dtype)
    finite_inputs = [x, sz] + ([] if bias is None else [bias])
    assert all(np.isfinite(np.asarray(a).astype(np.float64)).all() for a in finite_inputs), \
        "assert_int4_close takes finite x, scales_and_zeros and bias"
    ref = int4_reference(x, q, sz, group_size, bias)
    terms = _int4_terms(x, q, sz, group_size, planes, byte_sums)
    tol = int4_bound(x, q, sz, group_size, bias, dtype, daz, planes, dequantized, byte_sums,
                     terms=terms)
    overflow = int4_may_overflow(x, q, sz, group_size, bias, planes, byte_sums, terms=terms)
    assert y.shape == ref.shape, (y.shape, ref.shape)
    y64 = y.astype(np.float64)
    assert not (np.isnan(y64) & ~overflow).any(), "NaN where no fp32 intermediate may overflow"
    _assert_numbers_within(y64, ref, tol, overflow, dtype)
