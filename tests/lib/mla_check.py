"""Shared checks for the sparse MLA kernel tests: exact (float64) references with derived
tolerances, inputs, poisoned outputs, and the CPU interpreter switch.

On a machine without CUDA the Triton kernels run in the interpreter (TRITON_INTERPRET=1, set
here, so import this module before the kernel modules) with fp16/fp32 inputs: bf16 tl.dot is wrong
in the interpreter, so bf16 is tested on the GPU only. With CUDA present every test runs
on the GPU instead (compiled), bf16 included, plus real-model shapes.

Tolerance (derived, see `bounds`): for each (b, h) let Delta bound the fp32 score error,
gamma_{D+8} * sum_i |q_i k_i| * sm_scale with gamma_n = n u32 / (1 - n u32). The normalised
softmax weights then carry relative error <= exp(2 Delta) - 1, plus u_p from rounding P to the
input dtype before the P V dot (0 for fp32 inputs) and gamma_{topk+16} for the fp32
accumulations (sum of P, acc, split merge, exp2). With M = sum_j p_j |v_j| (exact, float64):
    |out - exact| <= 2 * ((exp(2 Delta) - 1 + u_p + gamma_{topk+16}) M + u_in |exact|)
where u_in |exact| is the final rounding to the input dtype and the factor 2 covers the
dropped second-order terms. lse: |lse - exact| <= 2 (Delta + gamma_{topk+16} (1 + |lse|)).
A real bug (a missed tile, a wrong row, a bad merge) is O(|v|), orders of magnitude above.
"""

from __future__ import annotations

import importlib
import math
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from servelab.kernels.sparse_mla.reference import sparse_mla_decode_reference  # noqa: E402

# One process runs Triton either compiled or interpreted, so: CUDA when present, else the CPU.
DEVICES = ["cuda"] if torch.cuda.is_available() else ["cpu"]
U32 = 2.0**-24
UNIT_ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8, torch.float32: 2.0**-24}


def dtypes(device: str) -> list[torch.dtype]:
    if device == "cpu":
        return [torch.float16, torch.float32]
    return [torch.float16, torch.bfloat16, torch.float32]


def gluon_here() -> bool:
    """Whether this machine runs the Gluon kernel (a Hopper GPU and a Triton with Gluon)."""
    from servelab.kernels.sparse_mla.gluon_kernels.common import gluon_device

    return gluon_device()


# Marks a test that runs a Gluon kernel (no CPU interpreter): it needs a Hopper GPU.
needs_hopper = pytest.mark.skipif(
    not torch.cuda.is_available() or not gluon_here(), reason="the Gluon kernel needs Hopper"
)

# (B, H, D_qk, d_v, topk) of the Gluon kernels' real-shape tests: V3.2, V4-Flash and V4-Pro at
# small B, and the TP slices (H 16 of V3.2, H 32 of V4-Flash).
real_shapes = pytest.mark.parametrize(
    "shape",
    [(4, 128, 576, 512, 2048), (8, 64, 512, 512, 640), (3, 128, 512, 512, 1152),
     (5, 16, 576, 512, 2048), (64, 32, 512, 512, 640)],
    ids=["v32_b4", "v4flash_b8", "v4pro_b3", "h16_b5", "h32_b64"],
)  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def interpreted_kernels():
    """On CPU the kernels must be interpreter functions; if another test imported the kernel
    modules before TRITON_INTERPRET was set, reload them so the decorator sees it."""
    if torch.cuda.is_available():
        yield
        return
    from triton.runtime.interpreter import InterpretedFunction

    from servelab.kernels.sparse_mla import naive
    from servelab.kernels.sparse_mla.splitkv import merge
    from servelab.kernels.sparse_mla.triton_kernels import fp8_chunked as triton_fp8
    from servelab.kernels.sparse_mla.triton_kernels import rp as triton_rp
    from servelab.kernels.sparse_mla.triton_kernels import split as triton_split

    kernels = ((merge, "_sparse_mla_merge_kernel"), (triton_fp8, "_sparse_mla_split_fp8_kernel"),
               (triton_rp, "_sparse_mla_split_rp_kernel"),
               (triton_split, "_sparse_mla_split_kernel"), (naive, "_sparse_mla_naive_kernel"))
    if not all(isinstance(getattr(m, k), InterpretedFunction) for m, k in kernels):
        for mod, _ in kernels:  # in import order: the split kernels bind merge's names
            importlib.reload(mod)
    yield


def gamma(n: int) -> float:
    return n * U32 / (1 - n * U32)


def partials_rounded(ran) -> bool:
    """Whether a split-KV launch (its dispatch.Ran record) kept 16-bit partials (bounds()'s
    partial_rounded)."""
    return ran.partials in ("bfloat16", "float16")


def bounds(q, kv, idx, sm_scale, d_v, dtype, kv_rounded=False, partial_rounded=False):
    """(exact out, exact lse, out tolerance, lse tolerance) in float64, derivation above.

    kv_rounded: the FP8 paths, which round each dequantised KV value before the dots: the
    Triton kernels once to `dtype`, the Gluon kernels in fp16 twice (the scale, then the
    product: relative 2^-10 + 2^-22) with fp16 q and P, for 16-bit q only. With u_kv the
    larger of the two this adds u_kv sum|q||k| to Delta and u_kv to the weights' relative
    error; fp16 subnormals (|value| < 2^-14) carry an absolute error instead, up to 2^-25 per
    value plus 448 x 2^-25 from a subnormal scale, and P's up to 2^-25 per weight: abs_kv
    sum|q| sm_scale more in Delta, abs_kv + topk 2^-25 max|v| more in the output.
    partial_rounded: each split's normalised partial O_s is rounded to `dtype` before the
    merge: |sum_s w_s (O_s rounded - O_s)| <= u_in sum_s w_s |O_s| <= u_in M,
    so u_in more relative error on M: pass partials_rounded() after a launch whose config the
    test did not choose (the ws kernel and, from B = 8, the FP8 Gluon kernel keep 16-bit
    partials by default)."""
    out_ex, lse_ex = sparse_mla_decode_reference(
        q, kv, idx, sm_scale, d_v, compute_dtype=torch.float64, out_dtype=torch.float64
    )
    qd, kvd = q.double(), kv.double()  # on q's device: fp64 is fast on the GPU
    valid = idx >= 0
    rows = kvd[idx.clamp(min=0).long()]  # [B, topk, D]
    abs_dot = torch.einsum("bhd,btd->bht", qd.abs(), rows.abs()) * sm_scale
    abs_dot = abs_dot.masked_fill(~valid[:, None, :], 0.0)
    d_qk, topk = q.shape[-1], idx.shape[-1]
    delta = gamma(d_qk + 8) * abs_dot.amax(dim=-1)  # [B, H]
    u_in = UNIT_ROUNDOFF[dtype]
    gluon16 = dtype != torch.float32  # the Gluon FP8 kernels may run: fp16 scale and product
    u_kv = max(u_in, 2.0**-10 + 2.0**-22) if gluon16 else u_in
    abs_kv = 449 * 2.0**-25 if gluon16 else 0.0  # fp16 subnormals: product and scale
    if kv_rounded:
        q_abs = qd.abs().sum(dim=-1) * sm_scale  # [B, H]
        delta = delta + u_kv * abs_dot.amax(dim=-1) + abs_kv * q_abs
    scores = torch.einsum("bhd,btd->bht", qd, rows) * sm_scale
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    lse = lse_ex.double()
    probs = torch.exp(scores - torch.where(torch.isinf(lse), 0.0, lse)[..., None])
    m = torch.einsum("bht,btd->bhd", probs, rows[..., :d_v].abs())  # sum_j p_j |v_j|
    u_p = 0.0 if dtype == torch.float32 else u_in
    g = gamma(topk + 16)
    rel = torch.expm1(2 * delta)[..., None] + u_p + g + (u_kv if kv_rounded else 0.0)
    rel = rel + (u_in if partial_rounded else 0.0)
    out_tol = 2 * (rel * m + u_in * out_ex.abs())
    if kv_rounded and gluon16:
        v_max = rows[..., :d_v].abs().amax(dim=(1, 2))[:, None, None]  # [B, 1, 1]
        out_tol = out_tol + 2 * (abs_kv + topk * 2.0**-25 * v_max)
    lse_tol = 2 * (delta + g * (1 + lse.abs().nan_to_num(posinf=0.0)))
    return out_ex.cpu(), lse.cpu(), out_tol.cpu(), lse_tol.cpu()


def assert_close(name, got, exact, tol):
    got = got.double().cpu()
    bad = ~((got - exact).abs() <= tol)  # NaN (unwritten poison) counts as bad
    both_ninf = torch.isneginf(got) & torch.isneginf(exact)
    bad &= ~both_ninf
    if bad.any():
        first = bad.nonzero()[:5].tolist()
        err = (got - exact).abs().nan_to_num(nan=math.inf)
        raise AssertionError(
            f"{name}: {int(bad.sum())}/{bad.numel()} elements outside the derived tolerance; "
            f"first at {first}; max abs err {err.max().item():.3g}, "
            f"max tol {tol.max().item():.3g}, got {got.flatten()[bad.flatten()][:3].tolist()}"
        )


def make(device, dtype, b, h, d_qk, topk, t=257, pad_frac=0.2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, d_qk, generator=gen).to(dtype)
    kv = torch.randn(t, d_qk, generator=gen).to(dtype)
    idx = torch.randint(0, t, (b, topk), generator=gen, dtype=torch.int32)
    pad = torch.rand(b, topk, generator=gen) < pad_frac
    idx[pad] = -1
    return q.to(device), kv.to(device), idx.to(device)


def poisoned(b, h, d_v, dtype, device):
    out = torch.full((b, h, d_v), float("nan"), dtype=dtype, device=device)
    lse = torch.full((b, h), float("nan"), dtype=torch.float32, device=device)
    return out, lse


def check_graph_replays(call, q, idx, out, lse, ref_kv, d_v, replays, tag, kv_rounded=False):
    """What the engine does with a decode step: compile `call()` outside a capture, capture it
    once in a CUDA graph, then for each (seed, pad_row) of `replays` copy new queries and
    indices (request pad_row all padding, unless None) into the captured inputs, NaN-poison
    the outputs, replay, and check against the exact result on `ref_kv`. `call()` returns
    the dispatch.SplitRun of its launch; returns the captured call's Ran record."""
    ran = call().ran
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        captured = call().ran
    assert captured == ran, (ran, captured)
    b, h, d_qk = q.shape
    for seed, pad_row in replays:
        q2, _, idx2 = make("cuda", q.dtype, b, h, d_qk, idx.shape[1], t=ref_kv.shape[0],
                           pad_frac=0.05, seed=seed)  # fmt: skip
        if pad_row is not None:
            idx2[pad_row] = -1
        q.copy_(q2)
        idx.copy_(idx2)
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        out_ex, lse_ex, out_tol, lse_tol = bounds(
            q, ref_kv, idx, d_qk**-0.5, d_v, q.dtype, kv_rounded=kv_rounded,
            partial_rounded=partials_rounded(ran))  # fmt: skip
        assert_close(f"{tag} graph seed {seed} out", out, out_ex, out_tol)
        assert_close(f"{tag} graph seed {seed} lse", lse, lse_ex, lse_tol)
    del g
    return ran


class BrokenKernel:
    """Stands in for a Gluon kernel in the compile-failure tests: its launch raises as a
    failed compile does and records each try's grid in `tries`."""

    def __init__(self):
        self.tries = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.tries.append(grid)
            raise RuntimeError("PassManager::run failed")

        return launch


def plan_for(cfg, q, kv, d_v, tiles_per_split, num_splits=1):
    """A launch plan of `cfg` for q and the cache kv (16-bit or FP8) whose splits hold
    `tiles_per_split` tiles each (topk = splits x tiles x block_n): what serves() reads."""
    from servelab.kernels.sparse_mla.dispatch.defaults import load
    from servelab.kernels.sparse_mla.splitkv.plan import make_plan, make_problem

    topk = num_splits * tiles_per_split * cfg.block_n
    idx = torch.zeros(q.shape[0], topk, dtype=torch.int32, device=q.device)
    p = make_problem(q, kv, idx, 1.0, d_v, None, None)
    return make_plan(p, cfg, num_splits, load().merge, False, None)
