"""The register-q Gluon split kernel (splitkv_gluon_rq.py: q in the scorer's registers, a
3-deep K ring, two P V partitions): numbers against the exact reference (mla_check's derived
bounds), replay in a CUDA graph, and a compile for Hopper without a GPU. Gluon has no CPU
interpreter: the numeric tests need a Hopper GPU."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch
from mla_check import (
    assert_close,
    bounds,
    check_graph_replays,
    interpreted_kernels,
    make,
    needs_hopper,
    poisoned,
)

pytestmark = pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")
assert interpreted_kernels  # the module-scoped autouse fixture, imported to take effect here


def _check(q, kv, idx, d_v, splits, tag, cfg, ref):
    """One launch against `ref` (bounds(): the exact result and its tolerances)."""
    from servelab.kernels.sparse_mla.splitkv import LAST_PATH, splitkv_decode

    b, h, d_qk = q.shape
    out_ex, lse_ex, out_tol, lse_tol = ref
    out, lse = poisoned(b, h, d_v, q.dtype, q.device)
    o, lg = splitkv_decode(q, kv, idx, d_qk**-0.5, d_v, config=cfg, num_splits=splits, out=out,
                           lse=lse)  # fmt: skip
    assert LAST_PATH["split"] == "16bit_rq", (tag, LAST_PATH)
    assert_close(f"{tag} out", o, out_ex, out_tol)
    assert_close(f"{tag} lse", lg, lse_ex, lse_tol)
    return o, lg


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("d_v, h", [(256, 20), (512, 64)], ids=["d256_h20", "d512_h64"])
def test_toy_shapes_splits_padding_duplicates(d_v, h):
    """topk = 300 (a tail tile), 20% padding, duplicated rows, one all-padding request,
    split counts 1-8 (splits shorter than the ring, tiles past the split, programs past the
    last tile writing (0, -inf)), both 16-bit dtypes, 3- and 4-deep rings where they fit
    (d_v = 256: all of q in registers; 512: 384 columns in registers, 128 in shared memory);
    outputs NaN-poisoned before each call."""
    from servelab.kernels.sparse_mla import splitkv_gluon, splitkv_gluon_rq
    from servelab.kernels.sparse_mla.splitkv import GLUON_RQ

    ran = 0
    for dtype in (torch.bfloat16, torch.float16):
        q, kv, idx = make("cuda", dtype, 4, h, d_v, 300, t=900, seed=3)
        idx[2, 100:160] = idx[2, 0]
        idx[1] = -1
        ref = bounds(q, kv, idx, d_v**-0.5, d_v, dtype)
        for nk in (3, 4):
            cfg = dataclasses.replace(GLUON_RQ, num_stages=nk)
            if splitkv_gluon_rq.smem_bytes(splitkv_gluon_rq.consts(cfg, d_v)) > (
                splitkv_gluon.SMEM_LIMIT
            ):
                continue  # (a 4-deep ring of 512-wide rows does not fit)
            for splits in (1, 2, 3, 5, 8):
                tag = f"{d_v} {dtype} nk{nk} s{splits}"
                o, lg = _check(q, kv, idx, d_v, splits, tag, cfg, ref)
                assert torch.all(o[1] == 0) and torch.all(torch.isneginf(lg[1]))
                ran += 1
    assert ran >= 10, ran


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("shape", [(8, 64, 512, 512, 640), (3, 128, 512, 512, 1152),
                                   (64, 32, 512, 512, 640), (128, 64, 512, 512, 640)],
                         ids=["v4flash_b8", "v4pro_b3", "h32_b64", "v4flash_b128"])  # fmt: skip
def test_real_shapes(shape):
    from servelab.kernels.sparse_mla.splitkv import GLUON_RQ

    b, h, d_qk, d_v, topk = shape
    for dtype in (torch.bfloat16, torch.float16):
        q, kv, idx = make("cuda", dtype, b, h, d_qk, topk, t=70_000, pad_frac=0.05, seed=11)
        ref = bounds(q, kv, idx, d_qk**-0.5, d_v, dtype)
        for splits in (None, 3):
            _check(q, kv, idx, d_v, splits, f"{shape} {dtype} s{splits}", GLUON_RQ, ref)


@pytest.mark.gpu
@needs_hopper
def test_not_served_with_a_score_only_tail():
    """V3.2's 576-wide rows (a score-only tail) are not this kernel's: the config falls back
    to a Triton kernel, and says so."""
    from servelab.kernels.sparse_mla.splitkv import GLUON_RQ, LAST_PATH, splitkv_decode

    q, kv, idx = make("cuda", torch.bfloat16, 2, 64, 576, 300, t=900, seed=5)
    ref = bounds(q, kv, idx, 576**-0.5, 512, torch.bfloat16)
    o, lg = splitkv_decode(q, kv, idx, 576**-0.5, 512, config=GLUON_RQ)
    assert LAST_PATH["split"] == "16bit", LAST_PATH
    assert_close("tail out", o, ref[0], ref[2])


@pytest.mark.gpu
@needs_hopper
def test_replayed_inside_a_cuda_graph():
    from servelab.kernels.sparse_mla.splitkv import GLUON_RQ, splitkv_decode

    b, h, d_qk, d_v, topk = 16, 64, 512, 512, 640
    dtype = torch.bfloat16
    q, kv, idx = make("cuda", dtype, b, h, d_qk, topk, t=70_000, pad_frac=0.05, seed=21)
    out, lse = poisoned(b, h, d_v, dtype, "cuda")

    def call():
        splitkv_decode(q, kv, idx, d_qk**-0.5, d_v, config=GLUON_RQ, out=out, lse=lse)

    path = check_graph_replays(call, q, idx, out, lse, kv, d_v, ((22, 3), (23, 3)), "rq")
    assert path["split"] == "16bit_rq", path


_COMPILE = r"""
import json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from servelab.kernels.sparse_mla import splitkv_gluon
if not splitkv_gluon.AVAILABLE:
    print(json.dumps({"skip": "this Triton has no Gluon"})); sys.exit(0)
from triton.experimental.gluon._runtime import GluonASTSource
from servelab.kernels.sparse_mla import splitkv_gluon_rq as m
from servelab.kernels.sparse_mla.splitkv import GLUON_RQ
k = m._sparse_mla_split_gluon_rq_kernel
ce = m.consts(GLUON_RQ, 512)
ptrs = dict(q_ptr="*bf16", kv_ptr="*bf16", idx_ptr="*i32", o_ptr="*fp32", lse_ptr="*fp32")
sig = {n: "constexpr" if n in ce else ptrs.get(n, "fp32" if n == "scale_log2" else "i32")
       for n in k.arg_names}
vals = dict(H=64, topk=640, tiles_per_split=5, stride_qb8=64 * 512 // 8, stride_qh8=512 // 8,
            stride_kvt8=512 // 8, stride_ib=640, stride_ob=2 * 64 * 512, stride_os=64 * 512,
            stride_oh=512, stride_lb=128, stride_ls=64)
attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(k.arg_names)
         if sig[n].startswith("*") or (n in vals and vals[n] % 16 == 0)}
c = triton.compile(GluonASTSource(k, sig, ce, attrs), target=GPUTarget("cuda", 90, 32),
                   options=dict(num_warps=4))
ptx = c.asm["ptx"]
print(json.dumps({"shared": c.metadata.shared, "wgmma": ptx.count("wgmma.mma_async"),
                  "wgmma_rs": len(re.findall(r"wgmma\.mma_async[^;]*\},\s*\{", ptx)),
                  "mbarrier_wait": ptx.count("mbarrier.try_wait"),
                  "setmaxnreg": ptx.count("setmaxnreg"), "smem_est": m.smem_bytes(ce)}))
"""


def test_compiles_for_hopper():
    """Without a GPU: compile the V4-width kernel for sm_90a in a fresh process: wgmma (the
    score dot's register-A form among them), mbarrier waits and the partitions' register moves
    must be there, and its shared memory (three 64 KB K buffers) must fit 227 KB within the
    launcher's estimate (which decides serves())."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _COMPILE], env=env, capture_output=True,
                       text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    if "skip" in got:
        pytest.skip(got["skip"])
    assert got["wgmma"] > got["wgmma_rs"] > 0, got  # the score dot's A from registers
    assert got["mbarrier_wait"] > 0 and got["setmaxnreg"] > 0, got
    assert 3 * 64 * 512 * 2 < got["shared"] <= min(got["smem_est"], 227 * 1024), got
