"""ROAD's multigrid passes (:mod:`.impute`, :mod:`.multigrid`) in native code (issue 40),
built and loaded by the activations kernel's machinery
(:func:`inspect_model.methods.activations.kernel.library`: the machine's ``cc`` into the
private cache, ``INSPECT_MODEL_NATIVE=0`` turns it off, no compiler: ``None`` and the torch
path runs).

Why: a PCG iteration on the fine grid was some twenty torch ops over the batch (the
[1 2 1] x [1 2 1] filter as shifted slices, the operator's multiply-adds, the transfers), and
each coarse stencil application nine more; the solve of 18 ROAD masks at 224 px ran thousands
of small ops, about 0.3 s of CPU per image. Here each of them is one pass: the fine operator,
its residual and its smoothing step with the filter over a rolling buffer of three filtered
rows, a coarse stencil application (and its residual and smoothing) row by row, restriction
and prolongation. The arithmetic is float32 in torch's order (the filter's sums, the
stencil's terms summed offset by offset, the transfers' halves), so the results are torch's
to rounding (fused multiply-adds where the CPU has them, as torch's own vectorised kernels).
One thread per call: :func:`.impute.impute` runs the groups of masks side by side.
"""

from __future__ import annotations

import ctypes
from typing import Any

SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
/* torch's float order: no reassociation, no contraction but where written (FMA below) */
#if defined(__clang__)
#pragma clang fp reassociate(off) contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("no-associative-math", "fp-contract=off")
#endif
/* a b + c as torch's vectorised addcmul computes it: fused where the CPU has FMA */
#ifdef __FMA__
#define MAD(a, b, c) fmaf((a), (b), (c))
#else
#define MAD(a, b, c) ((a) * (b) + (c))
#endif
/* [1 2 1] along a row, zero outside */
static void rowbox(const float *restrict s, float *restrict d, int64_t w) {
    if (w == 1) { d[0] = 2.f * s[0]; return; }
    d[0] = s[1] + 2.f * s[0];
    for (int64_t x = 1; x < w - 1; x++) d[x] = (s[x - 1] + s[x + 1]) + 2.f * s[x];
    d[w - 1] = s[w - 2] + 2.f * s[w - 1];
}
/* n = b * ch images (h, w); c, e, g per mask (b, h, w). mode 0: out = c v - e box(v);
   1: out = r - c v + e box(v); 2: out = v + g (r - c v + e box(v)). */
int im_road_fine(const float *restrict v, const float *restrict r, const float *restrict c, const float *restrict e,
                 const float *restrict g, float *restrict out,
                 int64_t b, int64_t ch, int64_t h, int64_t w, int mode) {
    float *buf = (float *)malloc(sizeof(float) * (size_t)(4 * w));
    if (!buf) return 1;
    float *zero = buf + 3 * w;
    memset(zero, 0, sizeof(float) * (size_t)w);
    const int64_t hw = h * w;
    for (int64_t n = 0; n < b * ch; n++) {
        const float *V = v + n * hw, *R = r ? r + n * hw : 0;
        const int64_t mo = (n / ch) * hw;
        float *O = out + n * hw;
        float *rows[3] = {buf, buf + w, buf + 2 * w};
        rowbox(V, rows[1], w);
        const float *prev = zero;
        for (int64_t y = 0; y < h; y++) {
            float *cur = rows[(y + 1) % 3], *nxt = rows[(y + 2) % 3];
            const float *next = zero;
            if (y + 1 < h) { rowbox(V + (y + 1) * w, nxt, w); next = nxt; }
            const float *vy = V + y * w, *cy = c + mo + y * w, *ey = e + mo + y * w;
            float *oy = O + y * w;
            if (mode == 0) {
                for (int64_t x = 0; x < w; x++) oy[x] = MAD(-ey[x], (prev[x] + next[x]) + 2.f * cur[x], cy[x] * vy[x]);
            } else if (mode == 1) {
                const float *ry = R + y * w;
                for (int64_t x = 0; x < w; x++)
                    oy[x] = MAD(ey[x], (prev[x] + next[x]) + 2.f * cur[x], MAD(-cy[x], vy[x], ry[x]));
            } else {
                const float *ry = R + y * w, *gy = g + mo + y * w;
                for (int64_t x = 0; x < w; x++)
                    oy[x] = MAD(gy[x], MAD(ey[x], (prev[x] + next[x]) + 2.f * cur[x], MAD(-cy[x], vy[x], ry[x])), vy[x]);
            }
            prev = cur;
        }
    }
    free(buf);
    return 0;
}
/* s (b, 9, h, w) in (row, column) offset order, the centre 4th; v, r, out (b * ch, h, w), out not v;
   g (b, h, w). mode 0: out = A v; 1: out = r - A v; 2: out = v + g (r - A v). */
int im_road_stencil(const float *restrict s, const float *restrict v, const float *restrict r,
                    const float *restrict g, float *restrict out,
                    int64_t b, int64_t ch, int64_t h, int64_t w, int mode) {
    float *acc = (float *)malloc(sizeof(float) * (size_t)w);
    if (!acc) return 1;
    const int64_t hw = h * w;
    for (int64_t n = 0; n < b * ch; n++) {
        const float *V = v + n * hw, *S = s + (n / ch) * 9 * hw;
        for (int64_t y = 0; y < h; y++) {
            const float *vy = V + y * w, *s4 = S + 4 * hw + y * w;
            for (int64_t x = 0; x < w; x++) acc[x] = s4[x] * vy[x];
            for (int k = 0; k < 9; k++) {
                const int a = k / 3 - 1, o = k % 3 - 1;
                if (k == 4 || y + a < 0 || y + a >= h) continue;
                const float *sk = S + k * hw + y * w, *src = V + (y + a) * w + o;
                const int64_t x0 = o < 0 ? 1 : 0, x1 = o > 0 ? w - 1 : w;
                for (int64_t x = x0; x < x1; x++) acc[x] = MAD(sk[x], src[x], acc[x]);
            }
            float *oy = out + n * hw + y * w;
            if (mode == 0) {
                memcpy(oy, acc, sizeof(float) * (size_t)w);
            } else {
                const float *ry = r + n * hw + y * w;
                if (mode == 1) for (int64_t x = 0; x < w; x++) oy[x] = ry[x] - acc[x];
                else {
                    const float *gy = g + (n / ch) * hw + y * w;
                    for (int64_t x = 0; x < w; x++) oy[x] = MAD(gy[x], ry[x] - acc[x], vy[x]);
                }
            }
        }
    }
    free(acc);
    return 0;
}
/* One coarse value of the restriction along an axis (stride st): f[2J] + f[2J+1] / 2 + f[2J-1] / 2,
   the last odd value whole to the last point when size is 2n. */
static inline float rs1(const float *f, int64_t J, int64_t n, int64_t size, int64_t st) {
    const int64_t odd = size / 2, k = odd < n - 1 ? odd : n - 1;
    float c = f[2 * J * st];
    if (J < k) c += 0.5f * f[(2 * J + 1) * st];
    if (J >= 1 && J <= k) c += 0.5f * f[(2 * J - 1) * st];
    if (odd == n && J == n - 1) c += f[(2 * n - 1) * st];
    return c;
}
/* f (n, h, w) -> out (n, hc, wc): along the rows first, then the columns */
int im_road_restrict(const float *f, float *out, int64_t nimg, int64_t h, int64_t w, int64_t hc, int64_t wc) {
    float *t = (float *)malloc(sizeof(float) * (size_t)w);
    if (!t) return 1;
    for (int64_t n = 0; n < nimg; n++) {
        const float *F = f + n * h * w;
        for (int64_t J = 0; J < hc; J++) {
            for (int64_t x = 0; x < w; x++) t[x] = rs1(F + x, J, hc, h, w);
            float *o = out + (n * hc + J) * wc;
            for (int64_t I = 0; I < wc; I++) o[I] = rs1(t, I, wc, w, 1);
        }
    }
    free(t);
    return 0;
}
/* c (b * ch, hc, wc) prolonged to (h, w) (columns first, then rows: 2I is I, 2I + 1 the mean of
   I and I + 1, the last one replicated); mode 0: x = P c; 1: x += P c; 2: x += m P c (m (b, h, w)) */
int im_road_prolong(const float *c, const float *m, float *x, int64_t b, int64_t ch, int64_t hc, int64_t wc,
                    int64_t h, int64_t w, int mode) {
    float *t = (float *)malloc(sizeof(float) * (size_t)(hc * w + w));
    if (!t) return 1;
    float *row = t + hc * w;
    for (int64_t n = 0; n < b * ch; n++) {
        const float *C = c + n * hc * wc;
        for (int64_t I = 0; I < hc; I++) {
            const float *ci = C + I * wc;
            float *ti = t + I * w;
            for (int64_t j = 0; j < w; j++) {
                const int64_t J = j / 2;
                ti[j] = (j % 2 == 0 || J + 1 >= wc) ? ci[J] : (ci[J] + ci[J + 1]) * 0.5f;
            }
        }
        for (int64_t y = 0; y < h; y++) {
            const int64_t I = y / 2;
            const float *src = t + I * w;
            if (y % 2 == 1 && I + 1 < hc) {
                for (int64_t j = 0; j < w; j++) row[j] = (src[j] + src[j + w]) * 0.5f;
                src = row;
            }
            float *xy = x + (n * h + y) * w;
            if (mode == 0) memcpy(xy, src, sizeof(float) * (size_t)w);
            else if (mode == 1) for (int64_t j = 0; j < w; j++) xy[j] += src[j];
            else {
                const float *my = m + ((n / ch) * h + y) * w;
                for (int64_t j = 0; j < w; j++) xy[j] = MAD(my[j], src[j], xy[j]);
            }
        }
    }
    free(t);
    return 0;
}
/* One 1-D pass of the Galerkin product along a line of size values to n: out[I] = sum over
   the present taps k in (0, -1, 1) of W_k[I] f[2I + k], in that order, 0 first when tap 0 is
   absent (multigrid._pass); one loop per tap, so each vectorises. W (3, n). */
static inline void gpass(const float *restrict f, float *restrict o, int64_t n, int64_t size, const float *W,
                         const int *pr) {
    const int64_t hp = size / 2 < n ? size / 2 : n; /* the points I with f[2I + 1] inside */
    if (pr[0]) for (int64_t I = 0; I < n; I++) o[I] = f[2 * I] * W[I];
    else memset(o, 0, sizeof(float) * (size_t)n);
    if (pr[1]) for (int64_t I = 1; I < n; I++) o[I] = MAD(f[2 * I - 1], W[n + I], o[I]);
    if (pr[2]) for (int64_t I = 0; I < hp; I++) o[I] = MAD(f[2 * I + 1], W[2 * n + I], o[I]);
}
/* The same pass down the columns of a (size, wc) block, rows of wc values: vectorised over a row */
static void gpass_rows(const float *restrict f, float *restrict o, int64_t n, int64_t size, int64_t wc,
                       const float *W, const int *pr) {
    for (int64_t I = 0; I < n; I++) {
        float *restrict oi = o + I * wc;
        const float *f0 = f + 2 * I * wc, *fm = f0 - wc, *fp = f0 + wc;
        if (pr[0]) { const float w0 = W[I]; for (int64_t x = 0; x < wc; x++) oi[x] = f0[x] * w0; }
        else memset(oi, 0, sizeof(float) * (size_t)wc);
        if (pr[1] && I >= 1) { const float wm = W[n + I]; for (int64_t x = 0; x < wc; x++) oi[x] = MAD(fm[x], wm, oi[x]); }
        if (pr[2] && I < size / 2) { const float wp = W[2 * n + I]; for (int64_t x = 0; x < wc; x++) oi[x] = MAD(fp[x], wp, oi[x]); }
    }
}
/* P^T A P (multigrid.galerkin): s (b, 9, h, w) -> out (b, 9, hc, wc); pairs (7, 2) the (o, e)
   pairs, wx (7, 3, wc) / px (7, 3) the column taps' weights and presence, wy, py the rows'. */
int im_road_galerkin(const float *restrict s, float *restrict out, int64_t b, int64_t h, int64_t w, int64_t hc,
                     int64_t wc, const int *pairs, const float *wx, const int *px, const float *wy, const int *py) {
    float *cols = (float *)malloc(sizeof(float) * (size_t)(21 * h * wc + hc * wc));
    if (!cols) return 1;
    float *rows = cols + 21 * h * wc;
    for (int64_t bb = 0; bb < b; bb++) {
        const float *S = s + bb * 9 * h * w;
        float *O = out + bb * 9 * hc * wc;
        memset(O, 0, sizeof(float) * (size_t)(9 * hc * wc));
        for (int q = 0; q < 7; q++)
            for (int ey = 0; ey < 3; ey++)
                for (int64_t y = 0; y < h; y++)
                    gpass(S + (ey * 3 + pairs[2 * q + 1] + 1) * h * w + y * w, cols + ((q * 3 + ey) * h + y) * wc,
                          wc, w, wx + q * 3 * wc, px + q * 3);
        for (int p = 0; p < 7; p++)
            for (int q = 0; q < 7; q++) {
                gpass_rows(cols + (q * 3 + pairs[2 * p + 1] + 1) * h * wc, rows, hc, h, wc, wy + p * 3 * hc, py + p * 3);
                float *o = O + ((pairs[2 * p] + 1) * 3 + pairs[2 * q] + 1) * hc * wc;
                for (int64_t i = 0; i < hc * wc; i++) o[i] += rows[i];
            }
    }
    free(cols);
    return 0;
}
"""

_lib: list[Any] = []  # [the library or None], once loaded


def library() -> Any:
    """The loaded library, or ``None`` (turned off, or no compiler)."""
    if not _lib:
        from inspect_model.methods.activations import kernel

        lib = kernel.library("road", SOURCE)
        if lib is not None and hasattr(lib, "im_road_galerkin"):
            i64, ptr, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
            lib.im_road_fine.argtypes = [ptr] * 6 + [i64] * 4 + [i32]
            lib.im_road_stencil.argtypes = [ptr] * 5 + [i64] * 4 + [i32]
            lib.im_road_restrict.argtypes = [ptr, ptr] + [i64] * 5
            lib.im_road_prolong.argtypes = [ptr] * 3 + [i64] * 6 + [i32]
            lib.im_road_galerkin.argtypes = [ptr, ptr] + [i64] * 5 + [ptr] * 5
            for fn in (lib.im_road_fine, lib.im_road_stencil, lib.im_road_restrict, lib.im_road_prolong,
                       lib.im_road_galerkin):
                fn.restype = i32
        else:
            lib = None
        _lib.append(lib)
    return _lib[0]


def usable(t: Any) -> Any:
    """The library when ``t`` is a float32 CPU tensor and a kernel can be had, else ``None``."""
    import torch

    if t.dtype != torch.float32 or t.device.type != "cpu":
        return None
    return _lib[0] if _lib else library()


def _ptr(t: Any) -> int:
    return 0 if t is None else int(t.data_ptr())


def _dense(t: Any) -> Any:
    """``t`` in NCHW order (the loops' layout): itself when it is already."""
    return None if t is None else t.contiguous()


def _check(rc: int) -> None:
    if rc:
        raise MemoryError("ROAD's native multigrid pass could not allocate its row buffer")


class Passes:
    """The solver's passes for float32 CPU tensors (all contiguous): the fine operator with
    per-mask ``centre``, ``edge`` (B, 1, H, W), each method one native pass."""

    def __init__(self, lib: Any, centre: Any, edge: Any) -> None:
        self.lib, self.centre, self.edge = lib, centre.contiguous(), edge.contiguous()

    def fine(self, v: Any, r: Any = None, g: Any = None) -> Any:
        """op(v) = centre v - edge box(v); with r: r - op(v); with g (B, 1, H, W) too: v + g (r - op(v))."""
        import torch

        b, c, h, w = v.shape
        v, r, g = _dense(v), _dense(r), _dense(g)
        out = torch.empty(v.shape, dtype=v.dtype)
        mode = 0 if r is None else 1 if g is None else 2
        _check(self.lib.im_road_fine(_ptr(v), _ptr(r), _ptr(self.centre), _ptr(self.edge), _ptr(g), _ptr(out),
                                     b, c, h, w, mode))
        return out

    def stencil(self, s: Any, v: Any, r: Any = None, g: Any = None) -> Any:
        """A v for the stencil s (B, 9, 1, h, w); with r: r - A v; with g (B, 1, h, w) too: v + g (r - A v)."""
        import torch

        b, c, h, w = v.shape
        s, v, r, g = _dense(s), _dense(v), _dense(r), _dense(g)
        out = torch.empty(v.shape, dtype=v.dtype)
        mode = 0 if r is None else 1 if g is None else 2
        _check(self.lib.im_road_stencil(_ptr(s), _ptr(v), _ptr(r), _ptr(g), _ptr(out), b, c, h, w, mode))
        return out

    def restrict(self, f: Any, hw: tuple[int, int]) -> Any:
        import torch

        b, c, h, w = f.shape
        f = _dense(f)
        out = torch.empty(b, c, *hw, dtype=f.dtype)
        _check(self.lib.im_road_restrict(_ptr(f), _ptr(out), b * c, h, w, hw[0], hw[1]))
        return out

    def prolong_add(self, cv: Any, x: Any, m: Any = None) -> Any:
        """x += P cv, or x += m P cv with m (B, 1, h, w); returns x."""
        b, c, hc, wc = cv.shape
        h, w = x.shape[-2:]
        if not x.is_contiguous():
            raise ValueError("prolong_add writes into a contiguous tensor")
        cv, m = _dense(cv), _dense(m)
        _check(self.lib.im_road_prolong(_ptr(cv), _ptr(m), _ptr(x), b, c, hc, wc, h, w, 1 if m is None else 2))
        return x


def galerkin(lib: Any, s: Any, hw: tuple[int, int], pairs: Any, tx: tuple[Any, Any], ty: tuple[Any, Any]) -> Any:
    """:func:`.multigrid.galerkin` in one native call: s (B, 9, h, w) contiguous float32; pairs
    (7, 2) int32; tx, ty the columns' and rows' (weights (7, 3, n) float32, presence (7, 3) int32)."""
    import torch

    b, _, h, w = s.shape
    s = _dense(s)
    out = torch.empty(b, 9, *hw, dtype=s.dtype)
    _check(lib.im_road_galerkin(_ptr(s), _ptr(out), b, h, w, hw[0], hw[1], _ptr(pairs), _ptr(tx[0]), _ptr(tx[1]),
                                _ptr(ty[0]), _ptr(ty[1])))
    return out
