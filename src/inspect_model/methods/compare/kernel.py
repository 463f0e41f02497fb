"""A pair's statistics in one read of each side (issue 38), in native code built and loaded
by the activations kernel's machinery (:func:`inspect_model.methods.activations.kernel.library`:
the machine's ``cc`` into the private cache, ``INSPECT_MODEL_NATIVE=0`` turns it off, no
compiler: ``None`` and the torch path of :mod:`.stats` runs).

Why: the torch path takes about ten passes over a differing pair (difference, its magnitude,
three sums of squares, the max, the share beyond the tolerance), 0.21x one forward of resnet18
for its 52 pairs; this loop reads ``a`` and ``b`` once and keeps every sum. Per block of 4,096
values the sums run in float32 vector lanes and are added in double (torch's float32 dot
keeps float32 over the whole chunk); ``a − b`` and the test ``|a−b| − tol·|a| > tol`` are the
same float32 operations as torch's (a fused multiply-add where the CPU has one, as torch's
vectorised ``sub(.., alpha=tol)``), the max and the counts are exact, so an identical pair's
Σ(a−b)² and max are exactly 0. NaN or Inf make a sum non-finite: the caller's careful path
runs then (the range counts hold for every element, non-finite ones too). Rows are split over
torch's OpenMP threads above 2^18 values.
"""

from __future__ import annotations

import ctypes
from typing import Any

STREAM_MIN = 1 << 20  # elements (4 MiB): smaller copies may still be in the cache when A reads them: torch's copy
SOURCE = r"""
#include <stdint.h>
#include <math.h>
#include <string.h>
#if defined(__AVX__)
#include <immintrin.h>
#endif
#define BLOCK 4096
#ifdef __FMA__
#define EXCESS(ad, tol, m) fmaf(-(tol), (m), (ad))
#else
#define EXCESS(ad, tol, m) ((ad) - (tol) * (m))
#endif
/* out: S(a-b)^2, Sa^2, Sb^2, max|a-b|, #(|a-b| - tol|a| > tol), #(|a| > big), #(0 < |a| < tiny) */
static inline void block(const float *restrict p, const float *restrict q, int64_t e, float tol, float big,
                         float tiny, int range, double *restrict o) {
    float sd = 0.f, sa = 0.f, sb = 0.f, mx = 0.f, c = 0.f, ov = 0.f, un = 0.f;
    for (int64_t i = 0; i < e; i++) {
        const float x = p[i], y = q[i], d = x - y, ad = fabsf(d), m = fabsf(x);
        sd += d * d; sa += x * x; sb += y * y;
        mx = ad > mx ? ad : mx;
        c += EXCESS(ad, tol, m) > tol ? 1.f : 0.f;
        if (range) { ov += m > big ? 1.f : 0.f; un += (m > 0.f && m < tiny) ? 1.f : 0.f; }
    }
    o[0] += sd; o[1] += sa; o[2] += sb; o[3] = mx > o[3] ? mx : o[3]; o[4] += c; o[5] += ov; o[6] += un;
}
void im_compare_f32(const float *restrict a, const float *restrict b, int64_t n, float tol, float big,
                    float tiny, int range, double *restrict out, int threads) {
    double D = 0, A = 0, B = 0, M = 0, C = 0, O = 0, U = 0;
    #pragma omp parallel for schedule(static) num_threads(threads) reduction(+:D,A,B,C,O,U) reduction(max:M) if (threads > 1 && n >= 262144)
    for (int64_t s = 0; s < n; s += BLOCK) {
        double o[7] = {0, 0, 0, 0, 0, 0, 0};
        const int64_t e = n - s < BLOCK ? n - s : BLOCK;
        if (range) block(a + s, b + s, e, tol, big, tiny, 1, o);
        else block(a + s, b + s, e, tol, big, tiny, 0, o);
        D += o[0]; A += o[1]; B += o[2]; M = o[3] > M ? o[3] : M; C += o[4]; O += o[5]; U += o[6];
    }
    out[0] = D; out[1] = A; out[2] = B; out[3] = M; out[4] = C; out[5] = O; out[6] = U;
}
/* dst = src, n floats, dst 32-byte aligned: streaming stores (no read of dst's lines into the cache) */
static void stream(float *restrict d, const float *restrict s, int64_t n) {
#if defined(__AVX__)
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m256 v0 = _mm256_loadu_ps(s + i), v1 = _mm256_loadu_ps(s + i + 8);
        const __m256 v2 = _mm256_loadu_ps(s + i + 16), v3 = _mm256_loadu_ps(s + i + 24);
        _mm256_stream_ps(d + i, v0); _mm256_stream_ps(d + i + 8, v1);
        _mm256_stream_ps(d + i + 16, v2); _mm256_stream_ps(d + i + 24, v3);
    }
    for (; i < n; i++) d[i] = s[i];
    _mm_sfence();
#else
    memcpy(d, s, (size_t)n * sizeof(float));
#endif
}
void im_copy_f32(float *restrict dst, const float *restrict src, int64_t n, int threads) {
    int64_t h = 0;
    while (h < n && ((uintptr_t)(dst + h) & 31)) { dst[h] = src[h]; h++; }
    float *restrict d = dst + h;
    const float *restrict s = src + h;
    const int64_t m = n - h;
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && m >= 262144)
    for (int64_t b = 0; b < m; b += 16384) stream(d + b, s + b, m - b < 16384 ? m - b : 16384);
}
"""

_lib: list[Any] = []  # [the library or None], once loaded
_threads: list[Any] = []  # [activations.kernel.threads]


def _library() -> Any:
    if not _lib:
        from inspect_model.methods.activations import kernel

        _threads.append(kernel.threads)
        lib = kernel.library("compare", SOURCE)
        if lib is not None and hasattr(lib, "im_copy_f32"):
            i64, ptr, f32, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float, ctypes.c_int
            lib.im_compare_f32.argtypes = [ptr, ptr, i64, f32, f32, f32, i32, ptr, i32]
            lib.im_copy_f32.argtypes = [ptr, ptr, i64, i32]
            lib.im_compare_f32.restype = lib.im_copy_f32.restype = None
        else:
            lib = None
        _lib.append(lib)
    return _lib[0]


def copy(out: Any, t: Any) -> bool:
    """``out.copy_(t)`` for two contiguous float32 CPU tensors of one size, ``STREAM_MIN``
    values or more, by streaming stores (``out``'s old contents are not read into the cache: a
    third less memory traffic than torch's copy, which counts when ``out`` is read only after
    the rest of B's forward, out of the cache by then); False (nothing done) for anything else,
    or without a kernel."""
    import torch

    n = t.numel()
    if n < STREAM_MIN or t.dtype != torch.float32 or out.dtype != torch.float32 or not t.is_cpu or not out.is_cpu \
            or out.numel() != n or not t.is_contiguous() or not out.is_contiguous():
        return False
    lib = _lib[0] if _lib else _library()
    if lib is None:
        return False
    lib.im_copy_f32(out.data_ptr(), t.data_ptr(), n, _threads[0]())
    return True


def pair(x: Any, y: Any, tolerance: float, low: Any) -> tuple[float, ...] | None:
    """(Σ(a−b)², Σa², Σb², max|a−b|, beyond, overflow, underflow) of two contiguous float32 CPU
    vectors of one length (overflow/underflow: of ``a`` in ``low``'s range, 0 when None), or
    ``None`` when they are something else or no kernel can be had."""
    import torch

    n = x.numel()
    if x.dtype != torch.float32 or y.dtype != torch.float32 or not x.is_cpu or not y.is_cpu or y.numel() != n \
            or not x.is_contiguous() or not y.is_contiguous():
        return None
    lib = _lib[0] if _lib else _library()
    if lib is None:
        return None
    big, tiny = (torch.finfo(low).max, torch.finfo(low).tiny) if low is not None else (0.0, 0.0)
    out = (ctypes.c_double * 7)()
    lib.im_compare_f32(x.data_ptr(), y.data_ptr(), n, tolerance, big, tiny, low is not None, out, _threads[0]())
    return tuple(out)
