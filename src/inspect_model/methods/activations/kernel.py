"""One-pass statistics of float32 rows in native code (issue 40): a 25-line C loop that reads
each value once and keeps ten sums per row, vectorised by the C compiler, built on first use
with the machine's own compiler into the user's cache and loaded with ctypes.

Why native code: the statistics of a layer output (sum, sum of squares, min, max, zero and
negative counts, and the same moments of its ReLU) took seven reads with torch's separate
reductions, 1.35-1.5x a no-grad forward on resnet50; one fused read of each output costs about
as much as two ``sum`` calls. torch offers no fused reduction on the CPU without a compiler
either (``torch.compile`` needs one, and 13 s).

What a row gives (``COLUMNS`` doubles): with ``k`` the median of the row's first, middle and
last values, the sums of (v - k)
and (v - k)^2 (shifted, so the variance does not cancel when the mean is far from zero), min,
max, the count of zeros and of negatives, the shift ``kp`` = 0 of the positive part and the
sums of max(v, 0) and its square (the same moments of the row after a ReLU; unshifted, as a
ReLU's output is mostly zeros: shifted by a first value that happened to be large, 3 of
resnet50's mostly-zero cells lost digits). Sums accumulate
in float32 over blocks of 4,096 values (16 vector lanes: about 256 values per lane) and are
added in double; counts are exact (int32 per block: one compare and one add per vector).
The positive part's two sums are 3 of the loop's 14 vector operations; ``positive=False``
leaves them out (25% less time per value) for outputs that no ReLU in place follows, which
``ActivationCapture`` learns from the batch before (resnet50: 91 of 125 reads). The shift is
found without branches (a mispredicted branch per row cost 8% on 7x7 cells).

Threads: the library is linked with ``-fopenmp`` against ``libgomp.so.1``, which resolves to
the libgomp torch has already loaded (same soname), so its loop runs on torch's own OpenMP
threads, as many as ``torch.get_num_threads()``, hot from the layer that just ran (Python
threads competed with them: 2 threads read resnet50 at 1.43x a forward against 1.15x on 1).

Safety: the library is built from the source below only, by ``cc``/``gcc``/``clang`` found on
PATH, into ``$XDG_CACHE_HOME/inspect-model/native`` (or ``~/.cache/...``), a directory this
user owns and nobody else may write; a library is loaded only from there, only when owned by
this user and not writable by others. The floating-point flags are the parts of
``-ffast-math`` that let loops vectorise, without the flush-to-zero start-up code that
``-ffast-math`` links into a library (it would change every float in the process).
``INSPECT_MODEL_NATIVE=0`` turns the kernel off; without a compiler the torch path runs.
NaN and Inf give a non-finite sum, and the caller takes its exact path then.

``im_rows_f32`` (:func:`grad_rows`) is the same one-read idea for ``grads``' gradient statistics
(methods/stats.py ``fast_stats``): unshifted sums, as a gradient's mean is near zero.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import torch

COLUMNS = 10
SOURCE = r"""
#include <stdint.h>
#include <string.h>
#define BLOCK 4096
/* One row's ten columns; pos (a constant where inlined) 0 leaves out the positive part's
   moments (columns 8, 9 zero): three of the fourteen vector operations per 16 values. */
static inline __attribute__((always_inline)) void im_row(const float *restrict p, int64_t s, double *restrict o,
                                                          const int pos) {
    /* the shift: the median of the first, middle and last values (a mostly-zero row gets 0) */
    const float a0 = p[0], a1 = p[s / 2], a2 = p[s - 1];
    /* branch-free: min and max instructions (a branch per row mispredicted on random data) */
    const float lo01 = a0 < a1 ? a0 : a1, hi01 = a0 < a1 ? a1 : a0, m = hi01 < a2 ? hi01 : a2;
    const float k = lo01 > m ? lo01 : m;
    const float kp = 0.f;
    double S = 0, Q = 0, Z = 0, N = 0, P = 0, R = 0;
    float lo = p[0], hi = p[0];
    for (int64_t b = 0; b < s; b += BLOCK) {
        const int64_t e = s - b < BLOCK ? s - b : BLOCK;
        const float *restrict q = p + b;
        float sm = 0.f, sq = 0.f, ps = 0.f, pq = 0.f, l = lo, h = hi;
        int32_t z = 0, ng = 0; /* integer counts: one compare and one add each, no float select */
        for (int64_t i = 0; i < e; i++) {
            const float v = q[i], d = v - k;
            sm += d; sq += d * d;
            l = v < l ? v : l; h = v > h ? v : h;
            z += v == 0.f; ng += v < 0.f;
            if (pos) { const float rv = (v > 0.f ? v : 0.f) - kp; ps += rv; pq += rv * rv; }
        }
        S += sm; Q += sq; Z += z; N += ng; P += ps; R += pq; lo = l; hi = h;
    }
    o[0] = k; o[1] = S; o[2] = Q; o[3] = lo; o[4] = hi; o[5] = Z; o[6] = N; o[7] = kp; o[8] = P; o[9] = R;
}
void im_cells_f32(const float *restrict x, int64_t rows, int64_t s, double *restrict out, int threads, int positive) {
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && rows > 1 && rows * s >= 65536)
    for (int64_t r = 0; r < rows; r++) {
        if (positive) im_row(x + r * s, s, out + r * 10, 1);
        else im_row(x + r * s, s, out + r * 10, 0);
    }
}
/* Gradient statistics (grads: methods/stats.py fast_stats): per row of s values, unshifted (a
   gradient's mean is near zero, and a shift would cost its digits), the sum, the sums of
   squares and of |v|, min, max, zeros and negatives; float32 over blocks of 1,024 values (64
   per vector lane at most), added in double. Rows of 10 columns, the last three unused. */
void im_rows_f32(const float *restrict x, int64_t rows, int64_t s, double *restrict out, int threads) {
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && rows > 1 && rows * s >= 65536)
    for (int64_t r = 0; r < rows; r++) {
        const float *restrict p = x + r * s;
        double S = 0, Q = 0, A = 0, Z = 0, N = 0;
        float lo = p[0], hi = p[0];
        for (int64_t b = 0; b < s; b += 1024) {
            const int64_t e = s - b < 1024 ? s - b : 1024;
            const float *restrict q = p + b;
            float sm = 0.f, sq = 0.f, ab = 0.f, l = lo, h = hi;
            int32_t z = 0, ng = 0;
            for (int64_t i = 0; i < e; i++) {
                const float v = q[i];
                sm += v; sq += v * v; ab += v < 0.f ? -v : v;
                l = v < l ? v : l; h = v > h ? v : h;
                z += v == 0.f; ng += v < 0.f;
            }
            S += sm; Q += sq; A += ab; Z += z; N += ng; lo = l; hi = h;
        }
        double *o = out + r * 10;
        o[0] = S; o[1] = Q; o[2] = A; o[3] = lo; o[4] = hi; o[5] = Z; o[6] = N;
    }
}
/* Images of c cells of s values from a finite table t (n*c rows): per image (IMAGE columns)
   mean, m2 (Chan's merge of the cells; 0 when min == max), min, max, zeros, negatives, the
   fraction of dead cells, and 1 where a cell's squared deviations lost more than three digits;
   per channel the sum over images (sums) and whether the cell is dead in every image (dead).
   Images, then channels, are split over the threads when many; each number is summed in the
   same order whatever their count. Returns 1 on NaN/Inf, 2 when some cell lost digits, else 0. */
int im_images(const double *restrict t, int64_t n, int64_t c, int64_t s, double *restrict img,
              double *restrict sums, unsigned char *restrict dead_all, int threads) {
    const double sd = (double)s;
    int bad = 0, any_lost = 0;
    /* Split over the threads only when large (resnet50 at batch 8 has at most 16,384 cells): a
       parallel region's barrier waits for a thread the OS has descheduled, 2 regions more per
       layer read resnet50 at 1.9x a forward on a busy 2-core machine, against 1.15x on one
       thread. One thread: the channels are summed in the images' pass. */
    const int split = threads > 1 && n > 1 && n * c >= 65536;
    if (!split) for (int64_t j = 0; j < c; j++) { sums[j] = 0; dead_all[j] = 1; }
    #pragma omp parallel for schedule(static) num_threads(threads) if (split) reduction(|: bad, any_lost)
    for (int64_t i = 0; i < n; i++) {
        const double *row = t + i * c * 10;
        double sum = 0, all = 0; /* NaN or Inf in any cell's shifted sums reaches all */
        for (int64_t j = 0; j < c; j++) {
            sum += sd * row[j * 10] + row[j * 10 + 1];
            all += row[j * 10 + 1] + row[j * 10 + 2];
        }
        uint64_t bits;
        memcpy(&bits, &all, sizeof bits); /* read from its bits: the flags let the compiler assume finite floats */
        if ((bits & 0x7ff0000000000000ULL) == 0x7ff0000000000000ULL) { bad = 1; continue; }
        const double mean = sum / (sd * (double)c);
        double m2 = 0, lo = row[3], hi = row[4], z = 0, ng = 0, dead = 0, lost = 0;
        for (int64_t j = 0; j < c; j++) {
            const double *o = row + j * 10;
            const double cm = o[0] + o[1] / sd;
            double cm2 = o[2] - o[1] * o[1] / sd;
            if (cm2 < 0 || o[3] == o[4]) cm2 = 0;
            if (cm2 * 1e3 < o[2] && o[3] < o[4]) lost = 1;
            m2 += cm2 + sd * (cm - mean) * (cm - mean);
            lo = o[3] < lo ? o[3] : lo; hi = o[4] > hi ? o[4] : hi;
            z += o[5]; ng += o[6];
            dead += o[5] == sd;
            if (!split) { sums[j] += sd * o[0] + o[1]; dead_all[j] &= o[5] == sd; }
        }
        double *r = img + i * 8;
        r[0] = mean; r[1] = lo == hi ? 0 : m2; r[2] = lo; r[3] = hi; r[4] = z; r[5] = ng; r[6] = dead / (double)c;
        r[7] = lost; any_lost |= lost != 0;
    }
    if (bad) return 1;
    #pragma omp parallel for schedule(static) num_threads(threads) if (split)
    for (int64_t j = 0; j < c * split; j++) {
        double cs = 0;
        unsigned char d = 1;
        for (int64_t i = 0; i < n; i++) {
            const double *o = t + (i * c + j) * 10;
            cs += sd * o[0] + o[1]; d &= o[5] == sd;
        }
        sums[j] = cs; dead_all[j] = d;
    }
    return any_lost ? 2 : 0;
}
"""
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-fassociative-math",
         "-fno-signed-zeros", "-freciprocal-math", "-ffinite-math-only", "-fopenmp", "-shared", "-fPIC")
COMPILERS = ("cc", "gcc", "clang")

_lock = threading.Lock()
_state: dict[str, Any] = {}


def cells(x: torch.Tensor, rows: int, s: int, positive: bool = True) -> torch.Tensor | None:
    """``(rows, COLUMNS)`` float64 table of the contiguous float32 CPU tensor ``x`` read as
    ``rows`` rows of ``s`` values; ``None`` when no kernel can be had (the caller's torch
    path). Rows are split over torch's OpenMP threads (ctypes lets the GIL go). The table lives
    in one of this thread's two buffers (:func:`_buffer`): valid until the second call after.
    ``positive`` False: no moments of the positive part (columns 8, 9 zero)."""
    fn = kernel()
    if fn is None:
        return None
    out = _buffer(rows)
    # torch's own OpenMP threads (the library links the libgomp torch loaded); one thread in a
    # forked child, where GNU OpenMP's pool is not usable.
    fn(x.data_ptr(), rows, s, out.data_ptr(), threads(), 1 if positive else 0)
    return out


def grad_rows(x: torch.Tensor, rows: int, s: int) -> torch.Tensor | None:
    """``(rows, COLUMNS)`` table of the contiguous float32 CPU tensor ``x`` read as ``rows``
    rows of ``s`` values by ``im_rows_f32`` (the columns are in its comment), in one of this
    thread's buffers as :func:`cells`; ``None`` when no kernel can be had."""
    import ctypes

    import torch

    lib = _library()
    if lib is None:
        return None
    fn = lib.im_rows_f32
    if fn.restype is not None:  # first use: ctypes' default restype is int
        fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                                   ctypes.c_int], None
    out = _buffer(rows)
    threads = torch.get_num_threads() if os.getpid() == _state.get("pid") else 1
    fn(x.data_ptr(), rows, s, out.data_ptr(), threads)
    return out


def images(table: torch.Tensor, n: int, c: int, s: int
           ) -> tuple[np.ndarray, torch.Tensor, torch.Tensor, bool] | None:
    """Per image an (n, 8) float64 array, per channel the sums over images (c,) float64 and
    whether the cell is dead in every image (c,) bool, and whether some cell lost digits, from
    a ``cells`` table of ``n`` images of ``c`` cells of ``s`` values (the columns are in
    SOURCE's comment); ``None`` when the table holds NaN or Inf. The per-image array is a view
    of this thread's reused array, valid until its next call: copy what is kept. The
    channel tensors are new, made by torch's allocator (numpy's small arrays kept between
    the layers' large outputs pinned glibc's heap, resnet152's peak RSS 1.33x a forward)."""
    import numpy as np
    import torch

    lib = _library()
    have = getattr(_local, "merged", None)
    if have is None or have[0].size < n * 8:
        arr = np.frombuffer(_anonymous(max(n * 8, 512) * 8), dtype=np.float64)
        have = _local.merged = (arr, arr.ctypes.data)
    sums, dead = torch.empty(c, dtype=torch.float64), torch.empty(c, dtype=torch.bool)
    rc = lib.im_images(table.data_ptr(), n, c, s, have[1], sums.data_ptr(), dead.data_ptr(), threads())
    if rc == 1:
        return None
    return have[0][:n * 8].reshape(n, 8), sums, dead, rc == 2


_local = threading.local()


def stamp() -> tuple[int, int]:
    """(thread, buffers taken so far): a table stamped so is still whole while this is unchanged."""
    return threading.get_ident(), getattr(_local, "taken", 0)


def _buffer(rows: int) -> torch.Tensor:
    """A (rows, COLUMNS) view of this thread's next of two reused buffers. Reused, not
    allocated per layer: small tables kept alive between the layers' large outputs pinned
    glibc's heap (resnet152's peak RSS rose from 1.02x to 1.16x a plain forward)."""
    import torch

    bufs = getattr(_local, "bufs", None)
    if bufs is None:
        bufs = _local.bufs = [torch.empty(0, dtype=torch.float64), torch.empty(0, dtype=torch.float64)]
        _local.turn = 0
    _local.turn ^= 1
    _local.taken = getattr(_local, "taken", 0) + 1
    b = bufs[_local.turn]
    if b.numel() < rows * COLUMNS:
        size = max(rows * COLUMNS, 2 * b.numel(), 8192)
        b = bufs[_local.turn] = torch.frombuffer(_anonymous(size * 8), dtype=torch.float64)
    return b[:rows * COLUMNS].view(rows, COLUMNS)


def _anonymous(nbytes: int) -> Any:
    """Memory of its own mapping, outside malloc's heap: a buffer kept for the process, made
    while a forward's large outputs come and go, would sit among them and pin the heap."""
    import mmap

    return mmap.mmap(-1, nbytes)


def kernel() -> Any:
    """The loaded ctypes function, built on first use; ``None`` when turned off or when no
    compiler builds it (remembered for the process)."""
    lib = _library()
    return None if lib is None else lib.im_cells_f32


def _library() -> Any:
    if "lib" in _state:
        return _state["lib"]
    with _lock:
        if "lib" not in _state:
            _state["lib"] = None if os.environ.get("INSPECT_MODEL_NATIVE", "1") == "0" else _load()
    return _state["lib"]


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "inspect-model" / "native"


def _private(p: Path) -> bool:
    """Owned by this user and writable by nobody else (a library there is ours)."""
    try:
        st = p.stat()
    except OSError:
        return False
    return st.st_uid == os.getuid() and not st.st_mode & 0o022


def library(stem: str, source: str) -> Any:
    """Another native library (methods/compare/kernel.py's), built from ``source`` as this
    module's own is: same flags, compilers, private cache (``<stem>-<hash>.so``) and
    ``INSPECT_MODEL_NATIVE`` switch; the loaded ``ctypes.CDLL``, or ``None`` (remembered for
    the process). :func:`threads` says how many OpenMP threads its loops may use."""
    key = "lib:" + stem
    if key in _state:
        return _state[key]
    with _lock:
        if key not in _state:
            _state[key] = None if os.environ.get("INSPECT_MODEL_NATIVE", "1") == "0" else _open(source, stem)
    return _state[key]


def threads() -> int:
    """torch's thread count, or 1 in a forked child (GNU OpenMP's pool is not usable there)."""
    import torch

    return torch.get_num_threads() if os.getpid() == _state.get("pid") else 1


def _open(source: str, stem: str) -> Any:
    import ctypes

    try:
        lib_path = _build(source, stem)
        if lib_path is None:
            return None
        lib = ctypes.CDLL(str(lib_path))
        _state["pid"] = os.getpid()
    except (OSError, subprocess.SubprocessError):
        return None
    return lib


def _load() -> Any:
    import ctypes

    lib = _open(SOURCE, "stats")
    if lib is None or not hasattr(lib, "im_images"):
        return None
    cells_fn, images_fn = lib.im_cells_f32, lib.im_images
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    cells_fn.argtypes, cells_fn.restype = [ptr, i64, i64, ptr, ctypes.c_int, ctypes.c_int], None
    images_fn.argtypes, images_fn.restype = [ptr, i64, i64, i64, ptr, ptr, ptr, ctypes.c_int], ctypes.c_int
    return lib


def _machine() -> str:
    """What the library is built for: -march=native differs from one CPU to the next."""
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            cpu = "".join(line for line in fh if line.startswith(("model name", "flags")))[:8192]
    except OSError:
        pass
    return f"{platform.machine()} {platform.system()} {cpu}"


def _build(source: str, stem: str) -> Path | None:
    """The cached library for ``source``, flags and machine, compiled when missing."""
    if not hasattr(os, "getuid"):
        return None
    compiler = next((c for c in (shutil.which(n) for n in COMPILERS) if c), None)
    if compiler is None:
        return None
    key = hashlib.sha256("\0".join((source, *FLAGS, compiler, _machine())).encode()).hexdigest()[:20]
    d = cache_dir()
    try:
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError:
        return None
    if not _private(d):
        return None
    lib = d / f"{stem}-{key}.so"
    if lib.exists():
        return lib if _private(lib) else None
    fd, src = tempfile.mkstemp(suffix=".c", dir=d)
    tmp = src[:-2] + ".so"
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(source)
        for flags in (FLAGS, tuple(f for f in FLAGS if f != "-fopenmp")):  # no OpenMP: one thread
            done = subprocess.run([compiler, *flags, src, "-o", tmp], stdin=subprocess.DEVNULL,
                                  capture_output=True, timeout=120, check=False)
            if done.returncode == 0 and os.path.exists(tmp):
                break
        else:
            return None
        os.chmod(tmp, 0o700)
        os.replace(tmp, lib)  # atomic: a concurrent run loads either no file or a whole one
    finally:
        for p in (src, tmp):
            if os.path.exists(p):
                os.unlink(p)
    return lib if _private(lib) else None
