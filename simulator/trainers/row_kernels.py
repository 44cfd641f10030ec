"""Numba kernels of CacheTrainer: one row's SGD steps on a chain of Linear(+ReLU) layers.

A layer's weights are w [out, in] (torch's layout), a minibatch is h [B, in]. The three
products of a step are written as loops that LLVM vectorises along the contiguous `in` axis
and that keep their partial sums in registers:
- forward_add:  z[b, j] += sum_k h[b, k] w[j, k]
- product_add:  out[b, k] += sum_j g[b, j] w[j, k] over listed rows j (the input gradient: all rows)
- sgd_update:   w[j, k] -= sum_b g[b, j] h[b, k]    the SGD update fused into the weight-gradient
                product (g holds lr * dLoss/dz, so nothing else touches the weights), listed rows j
Sparse inputs (MNIST's pixels) train the first layer transposed, w^T [in, out]: its forward
product is product_add over the inputs not zero in the batch, and its update sgd_update over
the same rows, so a pixel that is zero in all B samples costs nothing (about half of MNIST's 784
at B = 10). The delta goes back to torch's layout by 8 x 8 register transposes (an LLVM
intrinsic: numba has no shuffles). On an AMD EPYC family 25 model 1 (Zen 3), one thread: a step 203 -> 160 us, the
row's fixed cost 209 -> 238 us; whole MNIST rounds (traces, evaluation) 1.24x (1.17-1.33, 7
interleaved pairs in one process, the module before it loaded beside it).
How many partial sums a pass can keep depends on the CPU's vector registers, so forward_add,
sgd_update and product_add come in two blockings, chosen once per process (WIDE_REGISTERS):
- wide, 32 registers (AVX-512, AArch64's NEON): forward 4 rows of w x 5 of h (20 sums, 9 loads);
  update one row of w x 10 of h, so w is read and written once per step. Measured at B = 10 on
  an AMD EPYC (family 26, model 2), one thread, weights hot in cache: the MNIST MLP's 200 x 784
  forward 14 us (220 GFLOP/s), update 19 us (167 GFLOP/s; 31 us when it took 5 rows of h per pass
  and so read and wrote w twice), the 200 x 200 layer's three products 6-8 us each; a whole MLP
  step ~71 us. The same step calling sgemm from numba took 179 us with scipy's OpenBLAS and 199
  us with torch's MKL (at these sizes BLAS spends its time packing w); plain unblocked loops took
  950 us (one-off runs, /tmp scripts).
- narrow, 16 registers (x86 with AVX2 only): the wide forward's 20 sums spill to the stack (19-45
  GFLOP/s). Forward 2 rows of w x 5 of h (10 sums); update 3 rows of w x 5 of h per pass, each
  weight taking its products as a chain of FMAs into itself. On an AMD EPYC (family 25, model 1:
  Zen 3, AVX2), one thread, interleaved in one process (medians of 7-9 repetitions of 500-1,000
  calls): 200 x 784 forward 1.6x the wide blocking (73 GFLOP/s); update 2 rows x 5 of h with a
  separate product sum 1.15x the wide one, the FMA chains over 3 rows another 1.13-1.18x (59-67
  GFLOP/s). Whole MNIST rounds (traces, evaluation): the 2-row blocking 1.32x the wide one (1.26-
  1.39, 8 interleaved pairs), the FMA chains another 1.03x (1.01-1.04).
product_add too: wide 4 listed rows of w x 5 of g (20 factors), narrow 4 x 2 (8). On the Zen 3,
one thread, the transposed first layer's forward product on MNIST batches 1.27x the 4 x 5 (27 us
against 35, medians of 11 interleaved repetitions of 400 calls; 6 x 2 and 8 x 1 were 1.08 and
1.05x), the 200 x 200 input gradient 1.13x; whole MNIST rounds 1.08x (1.03-1.23, 9 interleaved
pairs). (Before the first layer was transposed, input-gradient blockings of 2 rows of g x 4 or 5
of w had measured 0.77-0.91x in whole rounds; measured again with the sparse layer, 4 x 2 won.)

fastmath is limited to reassociation and contraction (vectorised sums, FMA); nan and inf keep
their meaning, so a diverging run shows nan as the torch trainers do.
"""

from __future__ import annotations

import platform
from typing import Any

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic


def _wide_registers() -> bool:
    """Whether this CPU has 32 vector registers (AVX-512 on x86, any AArch64); False for x86 with 16."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return True
    return bool(llvm.get_host_cpu_features().get("avx512f", False))


# Chosen once: numba compiles the kernels for the host CPU, and its cache keys them by CPU too.
WIDE_REGISTERS = _wide_registers()

_KERNEL: dict[str, Any] = {"cache": True, "fastmath": {"reassoc", "contract"}, "boundscheck": False, "nogil": True}
# Without reassociation, so that LLVM keeps the narrow update's FMA chains as written (contraction: FMA).
_NARROW_UPDATE: dict[str, Any] = _KERNEL | {"fastmath": {"contract"}}


@njit(**_KERNEL)
def _forward_rest(w, h, z, j_from, j_to, b_from) -> None:  # pragma: no cover - compiled
    """z[b, j] += sum_k h[b, k] w[j, k] for rows j_from..j_to - 1 of w and b_from.. of h: a block's remainder."""
    for j in range(j_from, j_to):
        for b in range(b_from, h.shape[0]):
            s = np.float32(0)
            for k in range(w.shape[1]):
                s += w[j, k] * h[b, k]
            z[b, j] += s


@njit(**_KERNEL)
def _product_rest(g, w, out, rows, i_from, i_to, b_from) -> None:  # pragma: no cover - compiled
    """out[b, k] += g[b, j] w[j, k] for j = rows[i_from:i_to] and b_from.. of g: a block's remainder."""
    for i in range(i_from, i_to):
        j = rows[i]
        wj = w[j]
        for b in range(b_from, g.shape[0]):
            c = g[b, j]
            ob = out[b]
            for k in range(w.shape[1]):
                ob[k] += c * wj[k]


@njit(**_KERNEL)
def _update_rest(g, h, w, rows, n_rows, b_from) -> None:  # pragma: no cover - compiled
    """w[j, k] -= g[b, j] h[b, k] for rows b_from.. of h, one at a time, j = rows[:n_rows] (a block's remainder)."""
    for b in range(b_from, h.shape[0]):
        hb = h[b]
        for i in range(n_rows):
            j = rows[i]
            wj = w[j]
            c = g[b, j]
            for k in range(w.shape[1]):
                wj[k] -= c * hb[k]


@njit(**_KERNEL)
def forward_add_wide(w: np.ndarray, h: np.ndarray, z: np.ndarray) -> None:  # pragma: no cover - compiled
    """z[b, j] += sum_k h[b, k] w[j, k]; 4 rows of w x 5 of h per pass (20 sums in registers)."""
    n_out, n_in = w.shape
    batch = h.shape[0]
    j = 0
    while j + 4 <= n_out:
        w0, w1, w2, w3 = w[j], w[j + 1], w[j + 2], w[j + 3]
        b = 0
        while b + 5 <= batch:
            x0, x1, x2, x3, x4 = h[b], h[b + 1], h[b + 2], h[b + 3], h[b + 4]
            a00 = a01 = a02 = a03 = a04 = np.float32(0)
            a10 = a11 = a12 = a13 = a14 = np.float32(0)
            a20 = a21 = a22 = a23 = a24 = np.float32(0)
            a30 = a31 = a32 = a33 = a34 = np.float32(0)
            for k in range(n_in):
                v0, v1, v2, v3 = w0[k], w1[k], w2[k], w3[k]
                u0, u1, u2, u3, u4 = x0[k], x1[k], x2[k], x3[k], x4[k]
                a00 += v0 * u0; a01 += v0 * u1; a02 += v0 * u2; a03 += v0 * u3; a04 += v0 * u4  # noqa: E702
                a10 += v1 * u0; a11 += v1 * u1; a12 += v1 * u2; a13 += v1 * u3; a14 += v1 * u4  # noqa: E702
                a20 += v2 * u0; a21 += v2 * u1; a22 += v2 * u2; a23 += v2 * u3; a24 += v2 * u4  # noqa: E702
                a30 += v3 * u0; a31 += v3 * u1; a32 += v3 * u2; a33 += v3 * u3; a34 += v3 * u4  # noqa: E702
            z[b, j] += a00; z[b + 1, j] += a01; z[b + 2, j] += a02; z[b + 3, j] += a03; z[b + 4, j] += a04  # noqa: E702
            z[b, j + 1] += a10; z[b + 1, j + 1] += a11; z[b + 2, j + 1] += a12  # noqa: E702
            z[b + 3, j + 1] += a13; z[b + 4, j + 1] += a14  # noqa: E702
            z[b, j + 2] += a20; z[b + 1, j + 2] += a21; z[b + 2, j + 2] += a22  # noqa: E702
            z[b + 3, j + 2] += a23; z[b + 4, j + 2] += a24  # noqa: E702
            z[b, j + 3] += a30; z[b + 1, j + 3] += a31; z[b + 2, j + 3] += a32  # noqa: E702
            z[b + 3, j + 3] += a33; z[b + 4, j + 3] += a34  # noqa: E702
            b += 5
        _forward_rest(w, h, z, j, j + 4, b)  # rows of h past the last block of 5
        j += 4
    _forward_rest(w, h, z, j, n_out, 0)  # rows of w past the last block of 4


@njit(**_KERNEL)
def product_add_wide(g: np.ndarray, w: np.ndarray, out: np.ndarray, rows: np.ndarray,
                     n_rows: int) -> None:  # pragma: no cover - compiled
    """out[b, k] += sum_j g[b, j] w[j, k] over the rows j = rows[:n_rows] of w; 4 of them x 5 of g per pass.

    The input gradient (g_in = g w, all rows) and the first layer's forward product in its
    transposed layout (z += x w^T, only the inputs that are not zero in the batch).
    """
    n_in = w.shape[1]
    batch = g.shape[0]
    i = 0
    while i + 4 <= n_rows:
        j0, j1, j2, j3 = rows[i], rows[i + 1], rows[i + 2], rows[i + 3]
        w0, w1, w2, w3 = w[j0], w[j1], w[j2], w[j3]
        b = 0
        while b + 5 <= batch:
            o0, o1, o2, o3, o4 = out[b], out[b + 1], out[b + 2], out[b + 3], out[b + 4]
            g00, g01, g02, g03 = g[b, j0], g[b, j1], g[b, j2], g[b, j3]
            g10, g11, g12, g13 = g[b + 1, j0], g[b + 1, j1], g[b + 1, j2], g[b + 1, j3]
            g20, g21, g22, g23 = g[b + 2, j0], g[b + 2, j1], g[b + 2, j2], g[b + 2, j3]
            g30, g31, g32, g33 = g[b + 3, j0], g[b + 3, j1], g[b + 3, j2], g[b + 3, j3]
            g40, g41, g42, g43 = g[b + 4, j0], g[b + 4, j1], g[b + 4, j2], g[b + 4, j3]
            for k in range(n_in):
                v0, v1, v2, v3 = w0[k], w1[k], w2[k], w3[k]
                o0[k] += g00 * v0 + g01 * v1 + g02 * v2 + g03 * v3
                o1[k] += g10 * v0 + g11 * v1 + g12 * v2 + g13 * v3
                o2[k] += g20 * v0 + g21 * v1 + g22 * v2 + g23 * v3
                o3[k] += g30 * v0 + g31 * v1 + g32 * v2 + g33 * v3
                o4[k] += g40 * v0 + g41 * v1 + g42 * v2 + g43 * v3
            b += 5
        _product_rest(g, w, out, rows, i, i + 4, b)  # rows of g past the last block of 5
        i += 4
    _product_rest(g, w, out, rows, i, n_rows, 0)  # listed rows of w past the last block of 4


@njit(**_KERNEL)
def product_add_narrow(g: np.ndarray, w: np.ndarray, out: np.ndarray, rows: np.ndarray,
                       n_rows: int) -> None:  # pragma: no cover - compiled
    """out[b, k] += sum_j g[b, j] w[j, k] as product_add_wide; 4 listed rows of w x 2 of g per pass (8 factors)."""
    n_in = w.shape[1]
    batch = g.shape[0]
    i = 0
    while i + 4 <= n_rows:
        j0, j1, j2, j3 = rows[i], rows[i + 1], rows[i + 2], rows[i + 3]
        w0, w1, w2, w3 = w[j0], w[j1], w[j2], w[j3]
        b = 0
        while b + 2 <= batch:
            o0, o1 = out[b], out[b + 1]
            g00, g01, g02, g03 = g[b, j0], g[b, j1], g[b, j2], g[b, j3]
            g10, g11, g12, g13 = g[b + 1, j0], g[b + 1, j1], g[b + 1, j2], g[b + 1, j3]
            for k in range(n_in):
                v0, v1, v2, v3 = w0[k], w1[k], w2[k], w3[k]
                o0[k] += g00 * v0 + g01 * v1 + g02 * v2 + g03 * v3
                o1[k] += g10 * v0 + g11 * v1 + g12 * v2 + g13 * v3
            b += 2
        _product_rest(g, w, out, rows, i, i + 4, b)  # the last row of g when the batch is odd
        i += 4
    _product_rest(g, w, out, rows, i, n_rows, 0)  # listed rows of w past the last block of 4


@njit(**_KERNEL)
def sgd_update_wide(g: np.ndarray, h: np.ndarray, w: np.ndarray, rows: np.ndarray,
                    n_rows: int) -> None:  # pragma: no cover - compiled
    """w[j, k] -= sum_b g[b, j] h[b, k] for j = rows[:n_rows]: the weight gradient's product and the SGD
    step, one row of w x 10 of h. Rows of w not listed are left as they are (their gradient is zero)."""
    n_in = w.shape[1]
    batch = g.shape[0]
    b = 0
    while b + 10 <= batch:
        h0, h1, h2, h3, h4 = h[b], h[b + 1], h[b + 2], h[b + 3], h[b + 4]
        h5, h6, h7, h8, h9 = h[b + 5], h[b + 6], h[b + 7], h[b + 8], h[b + 9]
        for i in range(n_rows):
            j = rows[i]
            wj = w[j]
            c0, c1, c2, c3, c4 = g[b, j], g[b + 1, j], g[b + 2, j], g[b + 3, j], g[b + 4, j]
            c5, c6, c7, c8, c9 = g[b + 5, j], g[b + 6, j], g[b + 7, j], g[b + 8, j], g[b + 9, j]
            for k in range(n_in):
                wj[k] -= (c0 * h0[k] + c1 * h1[k] + c2 * h2[k] + c3 * h3[k] + c4 * h4[k]
                          + c5 * h5[k] + c6 * h6[k] + c7 * h7[k] + c8 * h8[k] + c9 * h9[k])
        b += 10
    _update_rest(g, h, w, rows, n_rows, b)  # a batch that is not a multiple of 10: the rest one by one


@njit(**_KERNEL)
def forward_add_narrow(w: np.ndarray, h: np.ndarray, z: np.ndarray) -> None:  # pragma: no cover - compiled
    """z[b, j] += sum_k h[b, k] w[j, k]; 2 rows of w x 5 of h per pass (10 sums in registers)."""
    n_out, n_in = w.shape
    batch = h.shape[0]
    j = 0
    while j + 2 <= n_out:
        w0, w1 = w[j], w[j + 1]
        b = 0
        while b + 5 <= batch:
            x0, x1, x2, x3, x4 = h[b], h[b + 1], h[b + 2], h[b + 3], h[b + 4]
            a00 = a01 = a02 = a03 = a04 = np.float32(0)
            a10 = a11 = a12 = a13 = a14 = np.float32(0)
            for k in range(n_in):
                v0, v1 = w0[k], w1[k]
                u0, u1, u2, u3, u4 = x0[k], x1[k], x2[k], x3[k], x4[k]
                a00 += v0 * u0; a01 += v0 * u1; a02 += v0 * u2; a03 += v0 * u3; a04 += v0 * u4  # noqa: E702
                a10 += v1 * u0; a11 += v1 * u1; a12 += v1 * u2; a13 += v1 * u3; a14 += v1 * u4  # noqa: E702
            z[b, j] += a00; z[b + 1, j] += a01; z[b + 2, j] += a02; z[b + 3, j] += a03; z[b + 4, j] += a04  # noqa: E702
            z[b, j + 1] += a10; z[b + 1, j + 1] += a11; z[b + 2, j + 1] += a12  # noqa: E702
            z[b + 3, j + 1] += a13; z[b + 4, j + 1] += a14  # noqa: E702
            b += 5
        _forward_rest(w, h, z, j, j + 2, b)  # rows of h past the last block of 5
        j += 2
    _forward_rest(w, h, z, j, n_out, 0)  # the last row of w when n_out is odd


@njit(**_NARROW_UPDATE)
def sgd_update_narrow(g: np.ndarray, h: np.ndarray, w: np.ndarray, rows: np.ndarray,
                      n_rows: int) -> None:  # pragma: no cover - compiled
    """w[j, k] -= sum_b g[b, j] h[b, k] for j = rows[:n_rows] as sgd_update_wide; 3 rows of w x 5 of h per pass.

    Each weight takes its 5 products as a chain of FMAs into itself (w -= c0 h0; w -= c1 h1; ...):
    no separate product sum, multiply and subtraction, and a shorter dependency chain.
    """
    n_in = w.shape[1]
    batch = g.shape[0]
    b = 0
    while b + 5 <= batch:
        h0, h1, h2, h3, h4 = h[b], h[b + 1], h[b + 2], h[b + 3], h[b + 4]
        i = 0
        while i + 3 <= n_rows:
            j0, j1, j2 = rows[i], rows[i + 1], rows[i + 2]
            w0, w1, w2 = w[j0], w[j1], w[j2]
            c0, c1, c2, c3, c4 = g[b, j0], g[b + 1, j0], g[b + 2, j0], g[b + 3, j0], g[b + 4, j0]
            d0, d1, d2, d3, d4 = g[b, j1], g[b + 1, j1], g[b + 2, j1], g[b + 3, j1], g[b + 4, j1]
            e0, e1, e2, e3, e4 = g[b, j2], g[b + 1, j2], g[b + 2, j2], g[b + 3, j2], g[b + 4, j2]
            for k in range(n_in):
                u0, u1, u2, u3, u4 = h0[k], h1[k], h2[k], h3[k], h4[k]
                a0, a1, a2 = w0[k], w1[k], w2[k]
                a0 -= c0 * u0; a1 -= d0 * u0; a2 -= e0 * u0  # noqa: E702
                a0 -= c1 * u1; a1 -= d1 * u1; a2 -= e1 * u1  # noqa: E702
                a0 -= c2 * u2; a1 -= d2 * u2; a2 -= e2 * u2  # noqa: E702
                a0 -= c3 * u3; a1 -= d3 * u3; a2 -= e3 * u3  # noqa: E702
                a0 -= c4 * u4; a1 -= d4 * u4; a2 -= e4 * u4  # noqa: E702
                w0[k], w1[k], w2[k] = a0, a1, a2
            i += 3
        for ii in range(i, n_rows):  # listed rows of w past the last block of 3
            jj = rows[ii]
            wj = w[jj]
            c0, c1, c2, c3, c4 = g[b, jj], g[b + 1, jj], g[b + 2, jj], g[b + 3, jj], g[b + 4, jj]
            for k in range(n_in):
                a0 = wj[k]
                a0 -= c0 * h0[k]
                a0 -= c1 * h1[k]
                a0 -= c2 * h2[k]
                a0 -= c3 * h3[k]
                a0 -= c4 * h4[k]
                wj[k] = a0
        b += 5
    _update_rest(g, h, w, rows, n_rows, b)  # rows of h past the last block of 5, one by one


forward_add = forward_add_wide if WIDE_REGISTERS else forward_add_narrow
sgd_update = sgd_update_wide if WIDE_REGISTERS else sgd_update_narrow
product_add = product_add_wide if WIDE_REGISTERS else product_add_narrow


@njit(**_KERNEL)
def pull_towards(w: np.ndarray, w0: np.ndarray, c: np.float32) -> None:  # pragma: no cover - compiled
    """w -= c * (w - w0), in place (FedProx's proximal step, c = lr * mu)."""
    for k in range(w.shape[0]):
        w[k] -= c * (w[k] - w0[k])


@njit(cache=True, nogil=True)
def softmax_xent(z: np.ndarray, y: np.ndarray, idx: np.ndarray, scale: np.float32,
                 g: np.ndarray) -> float:  # pragma: no cover - compiled
    """Mean cross-entropy of logits z [B, C] (shifted in place) for labels y[idx]; g = scale * dLoss_b/dz.

    As FastTrainer: the logits are shifted to max 0 and exp() sees at least -40, so it never
    takes float32's slow subnormal path; e^-40 is far below what it is added to.
    """
    batch, n_classes = z.shape
    loss = 0.0
    for b in range(batch):
        zb = z[b]
        m = zb.max()
        total = np.float32(0)
        for c in range(n_classes):
            zb[c] -= m
            e = np.exp(max(zb[c], np.float32(-40.0)))
            g[b, c] = e
            total += e
        label = y[idx[b]]
        loss += np.log(total) - zb[label]
        for c in range(n_classes):
            g[b, c] = (g[b, c] / total - (np.float32(1) if c == label else np.float32(0))) * scale
    return loss / batch


@njit(**_KERNEL)
def difference(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - compiled
    """out = a - b, in one pass (flat arrays)."""
    for k in range(a.shape[0]):
        out[k] = a[k] - b[k]


# An 8 x 8 transpose in three rounds of two-vector shuffles (AVX's unpack, shuffle and lane permute;
# LLVM lowers the same shuffles to NEON on AArch64): (first, second, lanes taken) per output vector.
_TRANSPOSE_8X8 = (
    [(p, p + 1, lanes) for p in (0, 2, 4, 6) for lanes in ((0, 8, 1, 9, 4, 12, 5, 13), (2, 10, 3, 11, 6, 14, 7, 15))],
    [(p, p + 2, lanes) for p in (0, 1, 4, 5) for lanes in ((0, 1, 8, 9, 4, 5, 12, 13), (2, 3, 10, 11, 6, 7, 14, 15))],
    [(p, p + 4, lanes) for lanes in ((0, 1, 2, 3, 8, 9, 10, 11), (4, 5, 6, 7, 12, 13, 14, 15)) for p in (0, 1, 2, 3)],
)


@intrinsic
def _difference_transposed_8x8(typingctx, a, a0, out, k0, j0):  # pragma: no cover - compiled
    """out[j0 + c, k0 + r] = a[k0 + r, j0 + c] - a0[k0 + r, j0 + c] for r, c < 8: eight vector loads from
    each of a and a0, their difference transposed in registers, eight vector stores."""
    sig = types.void(a, a0, out, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        vector = ir.VectorType(ir.FloatType(), 8)
        arrays = [(context.make_array(t)(context, builder, v), t) for t, v in zip(signature.args[:3], args[:3])]
        k, j = args[3], args[4]

        def at(which, i0, i1):  # a pointer to 8 floats from [i0, i1] of array `which`
            array, ty = arrays[which]
            item = cgutils.get_item_pointer2(context, builder, array.data, cgutils.unpack_tuple(builder, array.shape),
                                             cgutils.unpack_tuple(builder, array.strides), ty.layout, [i0, i1])
            return builder.bitcast(item, vector.as_pointer())

        def plus(i, n):
            return builder.add(i, ir.Constant(i.type, n))

        rows = [builder.fsub(builder.load(at(0, plus(k, r), j), align=4), builder.load(at(1, plus(k, r), j), align=4))
                for r in range(8)]
        for shuffles in _TRANSPOSE_8X8:
            rows = [builder.shuffle_vector(rows[p], rows[q], ir.Constant(ir.VectorType(ir.IntType(32), 8), list(m)))
                    for p, q, m in shuffles]
        for c in range(8):
            builder.store(rows[c], at(2, plus(j, c), k), align=4)
        return context.get_dummy_value()

    return sig, codegen


@njit(**_KERNEL)
def difference_transposed(wt: np.ndarray, wt0: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - compiled
    """out[j, k] = wt[k, j] - wt0[k, j]: a transposed layer's delta in torch's layout, 8 x 8 blocks at a time.

    Scalar loops took 220-400 us for the MNIST MLP's 784 x 200 (strided loads); the blocks take
    65-77, against 55-61 for the same difference without the transpose (AMD EPYC family 25,
    one thread, medians of 7 x 100 calls, the out rows going to memory as in training).
    """
    n_in, n_out = wt.shape
    k_end, j_end = n_in - n_in % 8, n_out - n_out % 8
    for j0 in range(0, j_end, 8):
        for k0 in range(0, k_end, 8):
            _difference_transposed_8x8(wt, wt0, out, k0, j0)  # type: ignore[call-arg]  # an intrinsic: numba passes its typing context
    for j in range(n_out):  # the columns and rows past the last whole block
        for k in range(k_end if j < j_end else 0, n_in):
            out[j, k] = wt[k, j] - wt0[k, j]


@njit(**_KERNEL)
def nonzero_columns(h: np.ndarray, flags: np.ndarray, columns: np.ndarray) -> int:  # pragma: no cover - compiled
    """Writes to columns[:n] the k where some h[b, k] != 0 (ascending) and returns n; flags [in] is scratch."""
    n_in = h.shape[1]
    flags[:] = 0
    for b in range(h.shape[0]):
        hb = h[b]
        for k in range(n_in):
            flags[k] |= hb[k] != 0
    n = 0
    for k in range(n_in):
        if flags[k]:
            columns[n] = k
            n += 1
    return n


@njit(**_KERNEL, inline="always")
def load_scaled(x, scale, out) -> None:  # pragma: no cover - compiled
    """out = x / scale in float32: uint8 pixel bytes (scale 255) divided as workloads.datasets.scaled
    divides them, or float32 features (scale 1) copied."""
    for k in range(x.shape[0]):
        out[k] = np.float32(x[k]) / np.float32(scale)


@njit(**_KERNEL, inline="always")  # inlined in Numba's IR: no call per training step
def chain_forward(w, bias, h, rows, first_transposed, inputs, n_inputs) -> None:  # pragma: no cover - compiled
    """The forward pass of a Linear(+ReLU) chain on the first `rows` rows of h[0]: h[l + 1] = layer l's
    output, ReLU after every layer but the last (the logits).

    first_transposed: w[0] is stored [in, out] (the trainer's layout), and only its rows
    inputs[:n_inputs] (the inputs not zero in this batch) enter the product; otherwise w[0] is
    [out, in] as every other layer, and inputs is not read.
    """
    n_layers = len(w)
    for layer in range(n_layers):
        z = h[layer + 1][:rows]
        for r in range(rows):
            z[r] = bias[layer]
        if layer == 0 and first_transposed:
            product_add(h[0][:rows], w[0], z, inputs, n_inputs)
        else:
            forward_add(w[layer], h[layer][:rows], z)
        if layer < n_layers - 1:
            for r in range(rows):
                zr = z[r]
                for k in range(zr.shape[0]):
                    if zr[k] < 0:
                        zr[k] = 0


@njit(cache=True, nogil=True)
def train_rows(x, x_scale, y, plan, rows, steps, lr, mu, source, w_start, b_start, w_work, b_work, w_out, b_out, h, g,
               loss_sum, first_transposed) -> int:  # pragma: no cover - compiled
    """Train plan column i's row rows[i] for steps[i] steps from model source[i]; w_out/b_out[l][row] get the delta.

    x [N, in] float32 (x_scale 1) or uint8 pixel bytes (x_scale 255, divided as evaluate_chain divides),
    y [N] int64: every shard's samples; plan [T, columns, B]: global sample
    indices; lr, mu float64 per column (mu: FedProx's weight); w_start[l] [G, out, in],
    b_start[l] [G, out]: start models; w_work[l] [out, in], b_work[l] [out]: the weights being
    trained, the same memory for every row so that it stays in cache; w_out[l] [R, out, in],
    b_out[l] [R, out] receive the deltas. With first_transposed, w_start[0] is [G, in, out] and
    w_work[0] [in, out] (w_out[0] stays in torch's layout).
    h[l] [B, width l] (h[0] the batch, h[l + 1] layer l's output) and g[l] [B, width l + 1]
    (lr * dLoss/d(layer l's output)) are scratch; loss_sum[row] gets the sum of step losses.
    Returns the first layer's inputs that entered the steps, summed over steps (in x steps if none
    was skipped).

    A transposed first layer makes an input that is zero in the whole batch cost nothing: it adds
    nothing to the forward product and its row of weights gets a zero gradient, so the step skips
    that row of w_work[0] in both (MNIST: about half of the 784 pixels in a batch of 10).
    """
    n_layers = len(w_start)
    batch = plan.shape[2]
    n_in = h[0].shape[1]
    flags = np.empty(n_in, dtype=np.uint8)
    inputs = np.empty(n_in, dtype=np.int64)
    widest = 0
    for layer in range(n_layers):
        widest = max(widest, b_work[layer].shape[0])
    every = np.arange(widest)  # all rows of a layer's w: the layers after the first
    inputs_used = 0
    for i in range(len(rows)):
        row, src = rows[i], source[i]
        for layer in range(n_layers):
            w_work[layer][:] = w_start[layer][src]
            b_work[layer][:] = b_start[layer][src]
        scale = np.float32(lr[i] / batch)  # lr folded into the output gradient, as FastTrainer does
        prox = np.float32(lr[i] * mu[i])
        total = 0.0
        for t in range(steps[i]):
            idx = plan[t, i]
            x_batch = h[0]
            for b in range(batch):
                load_scaled(x[idx[b]], x_scale, x_batch[b])
            n_inputs = nonzero_columns(x_batch, flags, inputs) if first_transposed else n_in
            inputs_used += n_inputs
            chain_forward(w_work, b_work, h, batch, first_transposed, inputs, n_inputs)
            total += softmax_xent(h[n_layers], y, idx, scale, g[n_layers - 1])
            for layer in range(n_layers - 1, -1, -1):
                w, bias, grad = w_work[layer], b_work[layer], g[layer]
                if layer:  # input gradient with the weights before their update; ReLU passes where h > 0
                    g_in, h_in = g[layer - 1], h[layer]
                    g_in[:] = 0
                    product_add(grad, w, g_in, every, w.shape[0])
                    for b in range(batch):
                        for k in range(g_in.shape[1]):
                            if not h_in[b, k] > 0:
                                g_in[b, k] = 0
                if mu[i] > 0:  # FedProx: lr * mu * (w - w_start), with the weights before this step's update
                    pull_towards(w.reshape(-1), w_start[layer][src].reshape(-1), prox)
                    pull_towards(bias, b_start[layer][src], prox)
                if layer == 0 and first_transposed:  # w[k, j] -= sum_b x[b, k] grad[b, j], k not zero in the batch
                    sgd_update(x_batch, grad, w, inputs, n_inputs)
                else:
                    sgd_update(grad, h[layer], w, every, w.shape[0])
                for b in range(batch):
                    bias -= grad[b]
        loss_sum[row] = total
        for layer in range(n_layers):
            if layer == 0 and first_transposed:
                difference_transposed(w_work[0], w_start[0][src], w_out[0][row])
            else:
                difference(w_work[layer].reshape(-1), w_start[layer][src].reshape(-1), w_out[layer][row].reshape(-1))
            difference(b_work[layer], b_start[layer][src], b_out[layer][row])
    return inputs_used


@njit(cache=True, nogil=True)
def evaluate_chain(x, y, scale, w, bias, h, chunk, first_transposed) -> tuple[int, float, int]:  # pragma: no cover
    """(correct predictions, summed cross-entropy, first-layer inputs used summed over blocks) of the
    Linear(+ReLU) chain w, bias on x [N, in], y [N].

    x is float32 (scale 1) or uint8 pixel bytes (scale 255: each feature is x / scale, divided
    as workloads.datasets.scaled divides); h[l] [B, width l] is scratch, B samples at a time.
    A sample's loss is its log-sum-exp minus its label's logit, in float32; as
    workloads.evaluation.evaluate sums them, `chunk` samples at a time in float32 and the
    chunks in float64. A prediction is the first largest logit (torch's argmax). With
    first_transposed, w[0] is [in, out] and each block skips the inputs zero in all its samples.
    """
    n_layers = len(w)
    block, n_in = h[0].shape
    flags = np.empty(n_in, dtype=np.uint8)
    inputs = np.empty(n_in, dtype=np.int64)
    inputs_used = 0
    correct = 0
    loss_sum = 0.0
    chunk_sum = np.float32(0)
    for start in range(0, x.shape[0], block):
        m = min(block, x.shape[0] - start)
        h0 = h[0]
        for r in range(m):
            load_scaled(x[start + r], scale, h0[r])
        n_inputs = nonzero_columns(h0[:m], flags, inputs) if first_transposed else n_in
        inputs_used += n_inputs * m
        chain_forward(w, bias, h, m, first_transposed, inputs, n_inputs)
        logits = h[n_layers]
        for r in range(m):
            zr = logits[r]
            best = 0
            for c in range(1, zr.shape[0]):
                if zr[c] > zr[best]:
                    best = c
            label = y[start + r]
            correct += best == label
            top = zr[best]
            total = np.float32(0)
            for c in range(zr.shape[0]):
                total += np.exp(zr[c] - top)
            chunk_sum += np.log(total) + top - zr[label]
            if (start + r + 1) % chunk == 0:
                loss_sum += chunk_sum
                chunk_sum = np.float32(0)
    return correct, loss_sum + chunk_sum, inputs_used  # type: ignore[return-value]  # numba boxes a float32 as a float
