"""The few-heads Gluon split kernels (gluon_nh.py: heads on the wgmma N dimension, for
the tensor-parallel slices), 16-bit and FP8 caches: numbers against the exact reference
(mla_check's derived bounds), replay in a CUDA graph, launch rules, and a compile for Hopper
without a GPU. Gluon has no CPU interpreter: the numeric tests need a Hopper GPU."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch
from mla_check import (
    DEVICES,
    BrokenKernel,
    assert_close,
    bounds,
    check_graph_replays,
    interpreted_kernels,
    make,
    needs_hopper,
    plan_for,
    poisoned,
)

pytestmark = pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")
assert interpreted_kernels  # the module-scoped autouse fixture, imported to take effect here


def _cfg(h: int, nbuf: int, fp8: bool = False):
    """The defaults' few-heads geometry for h heads (one 16- or 32-head block), ring nbuf."""
    from servelab.kernels.sparse_mla.dispatch.defaults import geometry

    name = ("nh16" if h <= 16 else "nh32") + ("_fp8" if fp8 else "")
    return dataclasses.replace(geometry(name), num_stages=nbuf)


def _serves(cfg, q, kv, d_v, tiles_per_split, drop=""):
    """gluon_nh's serves() for the 16-bit or the FP8 kernel (by the cache) on cfg's geometry."""
    from servelab.kernels.sparse_mla.gluon_kernels import nh as gluon_nh
    from servelab.kernels.sparse_mla.splitkv.lab import Lab

    fp8 = not isinstance(kv, torch.Tensor)
    cfg = dataclasses.replace(cfg, kernel="gluon_nh_fp8" if fp8 else "gluon_nh")
    fn = gluon_nh.serves_fp8 if fp8 else gluon_nh.serves
    return fn(plan_for(cfg, q, kv, d_v, tiles_per_split), Lab(drop=drop))


def _fits(cfg, q, kv, d_v) -> bool:
    """Whether the kernel's shared memory (the launcher's estimate, with the index rows of a
    whole topk in one split) fits this geometry."""
    return _serves(cfg, q, kv, d_v, 2048 // 64)  # the largest topk here


def _ref(q, kv, idx, d_v):
    """The exact result (on the dequantised cache for FP8, values rounded) and its
    tolerances."""
    from servelab.kernels.sparse_mla.fp8 import dequantize_kv

    fp8 = not isinstance(kv, torch.Tensor)
    dense = dequantize_kv(kv) if fp8 else kv
    return bounds(q, dense, idx, q.shape[-1] ** -0.5, d_v, q.dtype, kv_rounded=fp8)


def _check(q, kv, idx, d_v, splits, tag, cfg, ref):
    """One launch against `ref`, outputs NaN-poisoned first; the nh kernel must have run."""
    from servelab.kernels.sparse_mla.dispatch.launch import splitkv_launch

    b, h, d_qk = q.shape
    out_ex, lse_ex, out_tol, lse_tol = ref
    out, lse = poisoned(b, h, d_v, q.dtype, q.device)
    run = splitkv_launch(q, kv, idx, d_qk**-0.5, d_v, config=cfg, num_splits=splits, out=out,
                         lse=lse)  # fmt: skip
    want = "gluon_nh" if isinstance(kv, torch.Tensor) else "gluon_nh_fp8"
    assert run.ran.variant == want, (tag, run.ran)
    assert_close(f"{tag} out", run.out, out_ex, out_tol)
    assert_close(f"{tag} lse", run.lse, lse_ex, lse_tol)
    return run.out, run.lse


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("d_qk, d_v", [(128, 128), (192, 128), (576, 512)],
                         ids=["no_tail", "tail", "v32_dims"])  # fmt: skip
@pytest.mark.parametrize("h", [5, 16, 20, 32])
def test_toy_shapes_splits_padding_duplicates(d_qk, d_v, h):
    """topk = 300 (a 44-token tail tile), 20% padding, duplicated rows, one all-padding
    request, head counts that fill a 16- or 32-head block or leave it partly empty, split
    counts 1-8 (at 8, programs past the last tile), ring depths 2 and 3 where they fit, both
    16-bit dtypes."""
    for dtype in (torch.bfloat16, torch.float16):
        q, kv, idx = make("cuda", dtype, 4, h, d_qk, 300, t=900, seed=3)
        idx[2, 100:160] = idx[2, 0]  # duplicates count once per slot
        idx[1] = -1
        ref = _ref(q, kv, idx, d_v)
        for nbuf in (2, 3):
            if not _fits(_cfg(h, nbuf), q, kv, d_v):
                assert d_qk == 576 and nbuf == 3  # 3 x 72 KB + q: over 227 KB
                continue
            for splits in (1, 2, 3, 5, 8):
                tag = f"{d_qk} h{h} {dtype} nb{nbuf} s{splits}"
                o, lg = _check(q, kv, idx, d_v, splits, tag, _cfg(h, nbuf), ref)
                assert torch.all(o[1] == 0) and torch.all(torch.isneginf(lg[1]))


# (d_qk, d_v, e4m3 columns, scale tile): the V3.2 layout (rope = score-only tail), the V4
# layout (rope = the last value columns), 128-column scale tiles.
FP8_TOY = {"v32_like": (192, 128, 128, 64), "v4_like": (256, 256, 192, 64),
           "v32_tile128": (320, 256, 256, 128)}  # fmt: skip


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("case", list(FP8_TOY))
@pytest.mark.parametrize("h", [16, 20])
def test_fp8_toy_layouts_splits_padding_duplicates(case, h):
    """The FP8 kernel on both layouts: padding, duplicates, an all-padding request, 1-8
    splits, ring depths 1-3, both 16-bit dtypes."""
    from servelab.kernels.sparse_mla.fp8 import quantize_kv

    d_qk, d_v, d_fp8, tile = FP8_TOY[case]
    for dtype in (torch.bfloat16, torch.float16):
        q, kv, idx = make("cuda", dtype, 4, h, d_qk, 300, t=900, seed=4)
        idx[2, 100:160] = idx[2, 0]
        idx[1] = -1
        cache = quantize_kv(kv, d_fp8, tile)
        ref = _ref(q, cache, idx, d_v)
        for nbuf in (1, 2, 3):
            for splits in (1, 2, 3, 5, 8):
                tag = f"{case} h{h} {dtype} nb{nbuf} s{splits}"
                o, lg = _check(q, cache, idx, d_v, splits, tag, _cfg(h, nbuf, True), ref)
                assert torch.all(o[1] == 0) and torch.all(torch.isneginf(lg[1]))


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("shape", [(5, 16, 576, 512, 2048), (64, 32, 512, 512, 640),
                                   (3, 8, 576, 512, 2048)],
                         ids=["h16_b5", "h32_b64", "h8_b3"])  # fmt: skip
def test_real_shapes(shape):
    """The TP slices at their real widths, 16-bit and FP8 (V3.2: 512 e4m3 in 128-column tiles
    + 64 rope; V4: 448 in 64-column tiles + 64 rope), default split count and 3 splits."""
    from servelab.kernels.sparse_mla.fp8 import quantize_kv

    b, h, d_qk, d_v, topk = shape
    for dtype in (torch.bfloat16, torch.float16):
        q, kv, idx = make("cuda", dtype, b, h, d_qk, topk, t=70_000, pad_frac=0.05, seed=11)
        cache = quantize_kv(kv, 512, 128) if d_qk == 576 else quantize_kv(kv, 448, 64)
        for src in (kv, cache):
            ref = _ref(q, src, idx, d_v)
            for nbuf in (2, 3):
                cfg = _cfg(h, nbuf, src is not kv)
                if not _fits(cfg, q, src, d_v):  # a 16-bit ring that does not fit
                    assert nbuf == 3 and src is kv and (h > 16 or d_qk == 576), (shape, cfg)
                    continue
                for splits in (None, 3):
                    _check(q, src, idx, d_v, splits, f"{shape} {dtype} nb{nbuf} s{splits}",
                           cfg, ref)  # fmt: skip


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_replayed_inside_a_cuda_graph(fp8):
    """Captured once, replayed with new queries and indices (one request all padding), the
    outputs poisoned before each replay, as the engine's decode graphs do."""
    from servelab.kernels.sparse_mla.dispatch.launch import splitkv_launch
    from servelab.kernels.sparse_mla.fp8 import dequantize_kv, quantize_kv

    b, h, d_qk, d_v, topk = 16, 32, 512, 512, 640
    dtype = torch.bfloat16
    q, kv, idx = make("cuda", dtype, b, h, d_qk, topk, t=70_000, pad_frac=0.05, seed=21)
    src = quantize_kv(kv, 448, 64) if fp8 else kv
    out, lse = poisoned(b, h, d_v, dtype, "cuda")

    def call():
        return splitkv_launch(q, src, idx, d_qk**-0.5, d_v, config=_cfg(h, 2, fp8), out=out,
                              lse=lse)  # fmt: skip

    ref_kv = dequantize_kv(src) if fp8 else kv
    ran = check_graph_replays(call, q, idx, out, lse, ref_kv, d_v, ((22, 3), (23, 3)), "nh",
                              kv_rounded=fp8)  # fmt: skip
    assert ran.variant == ("gluon_nh_fp8" if fp8 else "gluon_nh"), ran


_COMPILE = r"""
import json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from servelab.kernels.sparse_mla.gluon_kernels import common as gluon_common
if not gluon_common.AVAILABLE:
    print(json.dumps({"skip": "this Triton has no Gluon"})); sys.exit(0)
from triton.experimental.gluon._runtime import GluonASTSource
from servelab.kernels.sparse_mla.gluon_kernels import nh as m
kind, bh, nbuf = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
v4 = kind.endswith("v4")
d_qk = 512 if v4 else 576
common = dict(D_V=512, BLOCK_H=bh, BLOCK_N=64, NBUF=nbuf, MAX_T=16 if v4 else 32, num_warps=4,
              DROP=0)
ptrs = dict(q_ptr="*bf16", kv_ptr="*bf16", d8_ptr="*fp8e4nv", rope_ptr="*bf16",
            sc_ptr="*fp32", idx_ptr="*i32", o_ptr="*bf16", lse_ptr="*fp32")
if kind.startswith("fp8"):
    k = m._sparse_mla_split_nh_fp8_kernel
    ce = dict(common, D_FP8=448 if v4 else 512, CW=64 if v4 else 128, NCH=7 if v4 else 4,
              NSC=8 if v4 else 4, D_ROPE=64, ROPE_IN_V=v4)
else:
    k = m._sparse_mla_split_nh_kernel
    ce = dict(common, D_TAIL=0 if v4 else 64, BLOCK_T=16 if v4 else 64)
sig = {n: "constexpr" if n in ce else ptrs.get(n, "fp32" if n == "scale_log2" else "i32")
       for n in k.arg_names}
topk = 640 if v4 else 2048
vals = dict(H=bh, topk=topk, tiles_per_split=topk // 64, stride_qb8=bh * d_qk // 8,
            stride_qh8=d_qk // 8, stride_kvt8=d_qk // 8, stride_d16=(448 if v4 else 512) // 16,
            stride_r8=8, stride_s=7 if v4 else 4, stride_ib=topk, stride_ob=bh * 512,
            stride_os=0, stride_oh=512, stride_lb=bh, stride_ls=0)
attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(k.arg_names)
         if sig[n].startswith("*") or (n in vals and vals[n] % 16 == 0)}
c = triton.compile(GluonASTSource(k, sig, ce, attrs), target=GPUTarget("cuda", 90, 32),
                   options=dict(num_warps=4))
ptx = c.asm["ptx"]
print(json.dumps({"shared": c.metadata.shared, "wgmma": ptx.count("wgmma.mma_async"),
                  "wgmma_n": sorted({int(n) for n in re.findall(
                      r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k", ptx)}),
                  "cp_async": ptx.count("cp.async.c"), "cvt_e4m3": ptx.count("e4m3x2"),
                  "smem_est": m.smem_bytes(ce)}))
"""


@pytest.mark.parametrize("kind, bh, nbuf", [
    ("16bit_v4", 32, 2), ("16bit_v32", 16, 2), ("16bit_v4", 16, 3), ("fp8_v4", 32, 2),
    ("fp8_v32", 16, 2)])  # fmt: skip
def test_compiles_for_hopper(kind, bh, nbuf):
    """Without a GPU: compile for sm_90a in a fresh process: the dots must be wgmma with the
    heads as N (n16 / n32, never a 64-row head tile), cp.async gathers (and e4m3 conversions
    for FP8), and shared memory within 227 KB and the launcher's estimate (serves())."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _COMPILE, kind, str(bh), str(nbuf)], env=env,
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    if "skip" in got:
        pytest.skip(got["skip"])
    assert got["wgmma"] > 0 and got["cp_async"] > 0, got
    assert got["wgmma_n"] == [bh], got
    assert (got["cvt_e4m3"] > 0) == kind.startswith("fp8"), got
    assert got["shared"] <= min(got["smem_est"], 227 * 1024), got


def test_serves_few_heads_only(monkeypatch):
    """serves(): all heads in one 16- or 32-head block, 64-token tiles over 4 warps, a ring
    that fits 227 KB (16-bit: 3 tiles only at H16 with V4's widths), d_v a power of two
    >= 128, the FP8 layouts of the FP8 Gluon kernel, 16-byte rows."""
    from servelab.kernels.sparse_mla.fp8 import quantize_kv
    from servelab.kernels.sparse_mla.gluon_kernels import common as gluon_common

    monkeypatch.setattr(gluon_common, "gluon_device", lambda device=None: True)
    monkeypatch.setattr(gluon_common, "FAILED", {})
    ok = _serves
    q16 = torch.zeros(2, 16, 576, dtype=torch.bfloat16)
    q32 = torch.zeros(2, 32, 512, dtype=torch.bfloat16)
    kv = torch.randn(100, 576).to(torch.bfloat16)
    kv4 = kv[:, :512].contiguous()
    assert ok(_cfg(16, 2), q16, kv, 512, 32) and ok(_cfg(32, 2), q32, kv4, 512, 10)
    assert ok(_cfg(16, 3), q16[:, :, :512], kv4, 512, 10)  # H16, V4 widths: 3 x 64 KB fit
    assert not ok(_cfg(32, 3), q32, kv4, 512, 10)  # 3 x 64 KB + q: over 227 KB
    assert not ok(_cfg(16, 3), q16, kv, 512, 32)  # V3.2 widths: 3 x 72 KB + q
    assert not ok(_cfg(16, 2), q32, kv4, 512, 10)  # 32 heads in a 16-head block
    assert not ok(dataclasses.replace(_cfg(16, 2), block_n=32), q16, kv, 512, 32)
    assert not ok(dataclasses.replace(_cfg(16, 2), block_h=64), q16, kv, 512, 32)
    assert not ok(_cfg(16, 1), q16, kv, 512, 32)  # a 16-bit ring needs 2 slots
    assert not ok(_cfg(16, 2), q16, kv, 500, 32)  # d_v not a power of two
    assert not ok(_cfg(16, 2), q16, kv, 512, 32, "dequant")  # an FP8-only diagnostic
    v32, v4 = quantize_kv(kv, 512, 128), quantize_kv(kv4, 448, 64)
    assert ok(_cfg(16, 1), q16, v32, 512, 32) and ok(_cfg(32, 3), q32, v4, 512, 10)
    assert not ok(_cfg(16, 2), q16, quantize_kv(kv, 512, 32), 512, 32)  # 32-column scales
    with pytest.raises(ValueError, match="16-bit part"):  # refused before any variant
        ok(_cfg(16, 2), q16.half(), v32, 512, 32)  # rope dtype != q dtype


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
@pytest.mark.parametrize("first", ["config", "default"])
def test_compile_failure(device, fp8, first, monkeypatch):
    """If the installed Triton rejects the kernel: warn once and never retry the compile; a
    config naming it raises; a default call (nh is the first rule at B = 8, H = 12) runs the
    next rule that serves: the Triton kernel on its own 16 x 32 tiles (the 64-head Gluon
    rules made unavailable here), with the right numbers, whichever call failed first."""
    from servelab.kernels.sparse_mla.dispatch.launch import splitkv_decode, splitkv_launch
    from servelab.kernels.sparse_mla.fp8 import quantize_kv
    from servelab.kernels.sparse_mla.gluon_kernels import common as gluon_common
    from servelab.kernels.sparse_mla.gluon_kernels import fp8 as gluon_fp8
    from servelab.kernels.sparse_mla.gluon_kernels import nh as gluon_nh
    from servelab.kernels.sparse_mla.gluon_kernels import ws as gluon_ws

    name = "_sparse_mla_split_nh_fp8_kernel" if fp8 else "_sparse_mla_split_nh_kernel"
    broken = BrokenKernel()
    monkeypatch.setattr(gluon_nh, name, broken, raising=False)
    monkeypatch.setattr(gluon_common, "FAILED", {})
    # Reachable where Gluon cannot run (the CPU, other GPUs): serves() then checks the rest.
    monkeypatch.setattr(gluon_common, "gluon_device", lambda device=None: True)
    monkeypatch.setattr(gluon_ws, "serves", lambda plan, lab: False)
    monkeypatch.setattr(gluon_fp8, "serves", lambda plan, lab: False)
    dtype = torch.float16
    q, kv, idx = make(device, dtype, 8, 12, 192, 70, seed=5)
    src = quantize_kv(kv, 128, 64) if fp8 else kv
    ref = _ref(q, src, idx, 128)
    cfg = _cfg(12, 2, fp8)
    warn = pytest.warns(UserWarning, match="few-heads .*Gluon split kernel did not compile")
    if first == "config":
        with warn, pytest.raises(ValueError, match="cannot run this call: did not compile"):
            splitkv_decode(q, src, idx, 192**-0.5, 128, config=cfg)
        with pytest.raises(ValueError, match="cannot run this call: does not serve"):
            splitkv_decode(q, src, idx, 192**-0.5, 128, config=cfg)
    for call in range(2):
        out, lse = poisoned(8, 12, 128, dtype, device)
        if call == 0 and first == "default":
            with warn:
                run = splitkv_launch(q, src, idx, 192**-0.5, 128, out=out, lse=lse)
        else:
            run = splitkv_launch(q, src, idx, 192**-0.5, 128, out=out, lse=lse)
        assert len(broken.tries) == 1, "the failed compile was retried"
        r = run.ran
        assert (r.variant, r.tile) == ("triton_fp8_chunked" if fp8 else "triton", "16x32"), r
        assert r.skipped[0].startswith(f"{cfg.kernel} (rule"), r
        assert_close(f"fallback {call} out", run.out, ref[0], ref[2])
        assert_close(f"fallback {call} lse", run.lse, ref[1], ref[3])
