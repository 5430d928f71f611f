"""The FP8 Gluon split kernel (gluon_fp8.py): numbers against the exact result on the
dequantised cache (mla_check's derived bounds, kv_rounded: each value's scale and product
are rounded to fp16 in the staging tile), its launch rules, its fallbacks, and a compile for Hopper without
a GPU. Gluon has no CPU interpreter: the numeric tests need a Hopper GPU."""

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
    gluon_here,
    interpreted_kernels,
    make,
    needs_hopper,
    plan_for,
    poisoned,
    real_shapes,
)

pytestmark = pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")
assert interpreted_kernels  # the module-scoped autouse fixture, imported to take effect here


def _gluon(nbuf: int = 2):
    from servelab.kernels.sparse_mla.splitkv.geometry import SplitConfig

    return SplitConfig(64, 64, 8, nbuf, 1, prefetch_idx=False, kernel="gluon_fp8")


def _ref(q, cache, idx, d_v, partial_rounded=False):
    """The exact result on the dequantised cache and its tolerances (values rounded; and the
    partials, for a config with 16-bit partials and several splits)."""
    from servelab.kernels.sparse_mla.fp8 import dequantize_kv

    return bounds(q, dequantize_kv(cache), idx, q.shape[-1] ** -0.5, d_v, q.dtype,
                  kv_rounded=True, partial_rounded=partial_rounded)  # fmt: skip


def _check(q, cache, idx, d_v, splits, tag, ref, cfg=None):
    from servelab.kernels.sparse_mla.dispatch.launch import splitkv_launch

    b, h, d_qk = q.shape
    scale = d_qk**-0.5
    out_ex, lse_ex, out_tol, lse_tol = ref
    out, lse = poisoned(b, h, d_v, q.dtype, q.device)
    run = splitkv_launch(q, cache, idx, scale, d_v, config=cfg or _gluon(),
                         num_splits=splits, out=out, lse=lse)  # fmt: skip
    ran = run.ran
    assert ran.variant == "gluon_fp8", (tag, ran)
    if ran.merge != "single":  # the config's partials (one split keeps none)
        want = q.dtype if (cfg or _gluon()).partial_dtype == "input" else torch.float32
        assert ran.partials == str(want).removeprefix("torch."), (tag, ran)
    assert_close(f"{tag} out", run.out, out_ex, out_tol)
    assert_close(f"{tag} lse", run.lse, lse_ex, lse_tol)
    return run.out, run.lse


# (d_qk, d_v, e4m3 columns, scale tile): the V3.2 layout (rope = score-only tail) and the V4
# layout (rope = the last value columns), at small widths the kernel serves.
TOY = {"v32_like": (192, 128, 128, 64), "v4_like": (128, 128, 64, 64),
       "v32_tile128": (320, 256, 256, 128)}  # fmt: skip


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("case", list(TOY))
def test_toy_layouts_splits_padding_duplicates(case):
    """topk = 300 (4 full tiles and a 44-token tail), 20% padding, duplicated rows, one
    all-padding request (out 0, lse -inf), split counts 1-8 (a split of one tile, trailing
    tiles past the split, programs past the last tile at 8), both 16-bit dtypes, fp32 and
    16-bit partials; outputs NaN-poisoned before each call."""
    from servelab.kernels.sparse_mla.fp8 import quantize_kv

    d_qk, d_v, d_fp8, tile = TOY[case]
    for dtype in (torch.bfloat16, torch.float16):
        q, kv, idx = make("cuda", dtype, 4, 20, d_qk, 300, t=900, seed=3)
        idx[2, 100:160] = idx[2, 0]  # duplicates count once per slot
        idx[1] = -1
        cache = quantize_kv(kv, d_fp8, tile)
        for partials in ("fp32", "input"):  # 16-bit partials: stored through the staging tile
            cfg = dataclasses.replace(_gluon(), partial_dtype=partials)
            ref = _ref(q, cache, idx, d_v, partial_rounded=partials == "input")
            for splits in (1, 2, 3, 5, 8):
                tag = f"{case} {dtype} {partials} s{splits}"
                o, lg = _check(q, cache, idx, d_v, splits, tag, ref, cfg)
                assert torch.all(o[1] == 0) and torch.all(torch.isneginf(lg[1]))


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("kernel", ["gluon_fp8", "gluon_nh_fp8"])
def test_small_scales_within_the_fp16_bound(kernel):
    """A cache of small values (|x| ~ 4e-3: every scale below 2^-14, fp16's normal range, so
    the fp16 staging sees subnormal scales and some subnormal products) on the 64-head and
    the few-heads FP8 kernel: within mla_check's bound, whose absolute terms stay under a
    quarter of the output (~0.1 here), so a kernel that flushed the values to zero fails."""
    from servelab.kernels.sparse_mla.dispatch.defaults import geometry
    from servelab.kernels.sparse_mla.dispatch.launch import splitkv_launch
    from servelab.kernels.sparse_mla.fp8 import quantize_kv

    h = 64 if kernel == "gluon_fp8" else 16
    cfg = _gluon() if kernel == "gluon_fp8" else geometry("nh16_fp8")
    for dtype in (torch.bfloat16, torch.float16):
        q, kv, idx = make("cuda", dtype, 4, h, 576, 300, t=900, seed=5)
        cache = quantize_kv(kv * 4e-3, 512, 128)
        assert bool((cache.scale < 2.0**-14).all())
        out_ex, lse_ex, out_tol, lse_tol = _ref(q, cache, idx, 512)
        out, lse = poisoned(4, h, 512, dtype, "cuda")
        run = splitkv_launch(q, cache, idx, 576**-0.5, 512, config=cfg, out=out, lse=lse)
        o, lg = run.out, run.lse
        assert run.ran.variant == kernel, run.ran
        assert float(out_tol.max()) < 0.25 * float(out_ex.abs().max())  # a bound that can fail
        assert_close(f"{kernel} {dtype} out", o, out_ex, out_tol)
        assert_close(f"{kernel} {dtype} lse", lg, lse_ex, lse_tol)


@pytest.mark.gpu
@needs_hopper
@real_shapes
def test_real_shapes(shape):
    """The model layouts (V3.2: 512 e4m3 in 128-column tiles + 64 rope; V4: 448 in 64-column
    tiles + 64 rope) at real head counts (H < 64 masked in the 64-head tile), with the default
    split count and with 3 splits; and a default call runs the first rule of the defaults
    file (this kernel, the few-heads one, or a Triton one), skipping none on the H200."""
    from servelab.kernels.sparse_mla.dispatch.defaults import default_config
    from servelab.kernels.sparse_mla.dispatch.launch import splitkv_launch
    from servelab.kernels.sparse_mla.fp8 import quantize_kv

    b, h, d_qk, d_v, topk = shape
    for dtype in (torch.bfloat16, torch.float16):
        q, kv, idx = make("cuda", dtype, b, h, d_qk, topk, t=70_000, pad_frac=0.05, seed=11)
        cache = quantize_kv(kv, 512, 128) if d_qk == 576 else quantize_kv(kv, 448, 64)
        ref = _ref(q, cache, idx, d_v)
        for splits in (None, 3):
            _check(q, cache, idx, d_v, splits, f"{shape} {dtype} s{splits}", ref)
        ran = splitkv_launch(q, cache, idx, d_qk**-0.5, d_v).ran
        want = default_config(b, h, d_qk, fp8_tile=cache.tile).kernel
        assert ran.variant == want and not ran.skipped, (shape, ran)


@pytest.mark.gpu
@needs_hopper
def test_replayed_inside_a_cuda_graph():
    """Captured once, replayed with new queries and indices (one request all padding), the
    outputs poisoned before each replay, as the engine's decode graphs do."""
    from servelab.kernels.sparse_mla.dispatch.launch import splitkv_launch
    from servelab.kernels.sparse_mla.fp8 import dequantize_kv, quantize_kv

    b, h, d_qk, d_v, topk = 16, 64, 512, 512, 640
    dtype = torch.bfloat16
    q, kv, idx = make("cuda", dtype, b, h, d_qk, topk, t=70_000, pad_frac=0.05, seed=21)
    cache = quantize_kv(kv, 448, 64)
    out, lse = poisoned(b, h, d_v, dtype, "cuda")

    def call():  # the default config: the FP8 Gluon kernel at B = 16
        return splitkv_launch(q, cache, idx, d_qk**-0.5, d_v, out=out, lse=lse)

    ran = check_graph_replays(call, q, idx, out, lse, dequantize_kv(cache), d_v,
                              ((22, 3), (23, 3)), "fp8", kv_rounded=True)  # fmt: skip
    assert ran.variant == "gluon_fp8", ran


_COMPILE = """
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from servelab.kernels.sparse_mla.gluon_kernels import common as gluon_common
if not gluon_common.AVAILABLE:
    print(json.dumps({"skip": "this Triton has no Gluon"})); sys.exit(0)
from triton.experimental.gluon._runtime import GluonASTSource
from servelab.kernels.sparse_mla.gluon_kernels import fp8 as m
v4 = sys.argv[1] == "v4"
k = m._sparse_mla_split_gluon_fp8_kernel
ce = dict(D_V=512, D_FP8=448 if v4 else 512, CW=64 if v4 else 128, NCH=7 if v4 else 4,
          NSC=8 if v4 else 4, D_ROPE=64, ROPE_IN_V=v4, BLOCK_H=64, BLOCK_N=64, NBUF=2,
          MAX_T=16 if v4 else 32, num_warps=8, DROP=0)  # a whole topk in one split
ptrs = dict(q_ptr="*bf16", d8_ptr="*fp8e4nv", rope_ptr="*bf16", sc_ptr="*fp32",
            idx_ptr="*i32", o_ptr="*bf16", lse_ptr="*fp32")
sig = {n: "constexpr" if n in ce else ptrs.get(n, "fp32" if n == "scale_log2" else "i32")
       for n in k.arg_names}
# the launcher's specialisations at B = 64, H = 64, one split: 16-aligned pointers and the
# int arguments that are multiples of 16 there
vals = dict(H=64, topk=640 if v4 else 2048, stride_qb8=64 * (512 if v4 else 576) // 8,
            stride_qh8=(512 if v4 else 576) // 8, stride_d16=(448 if v4 else 512) // 16,
            stride_r8=8, stride_s=7 if v4 else 4, stride_ib=640 if v4 else 2048,
            stride_ob=64 * 512, stride_os=0,
            stride_oh=512, stride_lb=64, stride_ls=0, tiles_per_split=10 if v4 else 32)
attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(k.arg_names)
         if sig[n].startswith("*") or (n in vals and vals[n] % 16 == 0)}
c = triton.compile(GluonASTSource(k, sig, ce, attrs), target=GPUTarget("cuda", 90, 32),
                   options=dict(num_warps=8))
ptx = c.asm["ptx"]
print(json.dumps({"shared": c.metadata.shared, "wgmma": ptx.count("wgmma.mma_async"),
                  "cp_async": ptx.count("cp.async.c"), "cvt_e4m3": ptx.count("e4m3x2"),
                  "smem_est": m.smem_bytes(ce)}))
"""


@pytest.mark.parametrize("layout", ["v32", "v4"])
def test_compiles_for_hopper(layout):
    """Without a GPU: compile for sm_90a (the H200) in a fresh process (no TRITON_INTERPRET):
    the code must lower to wgmma, cp.async and e4m3 conversions, and fit Hopper's 227 KB of
    shared memory per block, within the launcher's estimate (which decides serves())."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _COMPILE, layout], env=env, capture_output=True,
                       text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    if "skip" in got:
        pytest.skip(got["skip"])
    assert got["wgmma"] > 0 and got["cp_async"] > 0 and got["cvt_e4m3"] > 0, got
    staging_and_q = 2 * 64 * 512 * 2
    assert staging_and_q < got["shared"] <= min(got["smem_est"], 227 * 1024), got


def _phase_conflicts(regs, ring, cw: int) -> dict:
    """A model of Hopper's shared-memory banks (32 x 4 bytes; a 128-bit access is served 8
    threads at a time, one wavefront per 8 distinct 16-byte bank groups) applied to warp 0 of
    the FP8 kernels' dequantisation: each thread's 16 e4m3 values of a `cw`-column chunk
    (register layout `regs`) land by cp.async in the ring (shared layout `ring`, rows of `cw`
    bytes) and leave as two 16-byte fp16 stores into the staging tile, whose 128-byte swizzle
    puts 16-byte chunk k of row r at bank group k ^ (r % 8). Returns, per access, the extra
    wavefronts over all 8-thread phases (0 = free of conflicts)."""
    spt, tpw, order = list(regs.size_per_thread), list(regs.threads_per_warp), list(regs.order)
    assert spt == [1, 16] and order == [1, 0], regs
    extra = {"ring": 0, "staging": 0}
    for rep in range(max(cw // (tpw[1] * 16), 1)):  # a thread's column repeats in a chunk
        ring_groups, stage_groups = [], [[], []]
        for lane in range(32):
            row, t = divmod(lane, tpw[1])
            col = rep * tpw[1] * 16 + t * 16  # the thread's first column (= byte in the ring)
            v = col // ring.vec
            phase = (row // ring.per_phase) % ring.max_phase
            addr = row * cw + (v ^ phase) * ring.vec + col % ring.vec
            ring_groups.append((addr % 128) // 16)
            for s in range(2):  # its two 16-byte fp16 stores: 8 columns each
                c16 = col + 8 * s
                stage_groups[s].append(((c16 % 64) // 8) ^ (row % 8))
        for groups, key in ((ring_groups, "ring"), (stage_groups[0], "staging"),
                            (stage_groups[1], "staging")):  # fmt: skip
            for p in range(4):
                phase_groups = groups[8 * p: 8 * p + 8]
                extra[key] += max(phase_groups.count(g) for g in set(phase_groups)) - 1
    return extra


@pytest.mark.parametrize("cw", [64, 128])
@pytest.mark.parametrize("num_warps", [4, 8])
def test_dequantisation_shared_accesses_are_free_of_bank_conflicts(cw, num_warps):
    """The e4m3 chunk layouts of both FP8 kernels (V4's 64-column and V3.2's 128-column scale
    tiles): no 8-thread phase of the ring's 16-byte accesses or of the staging tile's fp16
    stores reaches a bank group twice (Nsight Compute counted 2.15 M such conflicts on the
    staging stores with 128-column chunks before the layout changed). The model itself flags
    that old layout (8 threads along a 128-column row, an unswizzled ring)."""
    from servelab.kernels.sparse_mla.gluon_kernels import common as gluon_common
    from servelab.kernels.sparse_mla.gluon_kernels import fp8 as m

    if not gluon_common.AVAILABLE:
        pytest.skip("needs triton.experimental.gluon")
    from triton.experimental.gluon import language as gl

    regs, ring = m._fp8_regs(cw, num_warps), m._fp8_ring_layout(cw)
    assert list(regs.warps_per_cta) == [num_warps, 1]
    assert _phase_conflicts(regs, ring, cw) == {"ring": 0, "staging": 0}
    if cw == 128:
        old = gl.BlockedLayout([1, 16], [32 // (cw // 16), cw // 16], [num_warps, 1], [1, 0])
        flat = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        assert _phase_conflicts(old, flat, cw)["staging"] > 0


def _reachable(monkeypatch):
    """Make the Gluon launches reachable where Gluon cannot run (the CPU, other GPUs):
    serves() as written but for the device check."""
    from servelab.kernels.sparse_mla.gluon_kernels import common as gluon_common

    if not gluon_here():
        monkeypatch.setattr(gluon_common, "gluon_device", lambda device=None: True)


@pytest.mark.parametrize("device", DEVICES)
def test_named_kernel_that_fails_to_compile_raises(device, monkeypatch):
    """If the installed Triton rejects the kernel, a config naming it raises (with a one-time
    warning giving the compiler's error) and the compile is not retried."""
    from servelab.kernels.sparse_mla.dispatch.launch import splitkv_decode
    from servelab.kernels.sparse_mla.fp8 import quantize_kv
    from servelab.kernels.sparse_mla.gluon_kernels import common as gluon_common
    from servelab.kernels.sparse_mla.gluon_kernels import fp8 as gluon_fp8

    broken = BrokenKernel()
    monkeypatch.setattr(gluon_fp8, "_sparse_mla_split_gluon_fp8_kernel", broken,
                        raising=False)  # fmt: skip
    monkeypatch.setattr(gluon_common, "FAILED", {})
    _reachable(monkeypatch)
    q, kv, idx = make(device, torch.float16, 3, 20, 128, 70, seed=5)
    cache = quantize_kv(kv, 64, 64)
    with pytest.warns(UserWarning, match="FP8 Gluon split kernel did not compile"):
        with pytest.raises(ValueError, match="'gluon_fp8' cannot run this call: did not compile"):
            splitkv_decode(q, cache, idx, 128**-0.5, 128, config=_gluon())
    with pytest.raises(ValueError, match="'gluon_fp8' cannot run this call: does not serve"):
        splitkv_decode(q, cache, idx, 128**-0.5, 128, config=_gluon())
    assert len(broken.tries) == 1, "the failed compile was retried"


def test_default_that_fails_to_compile_runs_the_next_fp8_rule(monkeypatch):
    """With no config (the FP8 default is this kernel at B = 4 with 32 heads), a failed compile
    runs the next matching rule: the Triton per-chunk kernel on its 16-head tiles, with the
    right numbers, and the record says what was skipped."""
    from servelab.kernels.sparse_mla.dispatch.launch import splitkv_launch
    from servelab.kernels.sparse_mla.fp8 import dequantize_kv, quantize_kv
    from servelab.kernels.sparse_mla.gluon_kernels import common as gluon_common
    from servelab.kernels.sparse_mla.gluon_kernels import fp8 as gluon_fp8

    monkeypatch.setattr(gluon_fp8, "_sparse_mla_split_gluon_fp8_kernel", BrokenKernel(),
                        raising=False)  # fmt: skip
    monkeypatch.setattr(gluon_common, "FAILED", {})
    _reachable(monkeypatch)
    device, dtype = DEVICES[0], torch.float16
    q, kv, idx = make(device, dtype, 4, 32, 128, 40, seed=9)
    cache = quantize_kv(kv, 64, 64)
    ex = bounds(q, dequantize_kv(cache), idx, 128**-0.5, 128, dtype, kv_rounded=True)
    with pytest.warns(UserWarning, match="FP8 Gluon split kernel did not compile"):
        run = splitkv_launch(q, cache, idx, 128**-0.5, 128)
    r = run.ran
    assert (r.variant, r.tile) == ("triton_fp8_chunked", "16x32"), r
    assert len(r.skipped) == 1 and r.skipped[0].startswith("gluon_fp8 (rule"), r
    assert_close("default fallback out", run.out, ex[0], ex[2])
    assert_close("default fallback lse", run.lse, ex[1], ex[3])


def test_serves_only_the_layouts_it_was_written_for(monkeypatch):
    """serves(): 64- or 128-column scale tiles, a 32-256-column rope, the V3.2 or V4 layout,
    16-byte rows, the 64 x 64 tile over 8 warps, shared memory within 227 KB."""
    from servelab.kernels.sparse_mla.fp8 import Fp8KVCache, quantize_kv
    from servelab.kernels.sparse_mla.gluon_kernels import common as gluon_common
    from servelab.kernels.sparse_mla.gluon_kernels import fp8 as gluon_fp8

    monkeypatch.setattr(gluon_common, "gluon_device", lambda device=None: True)
    monkeypatch.setattr(gluon_common, "FAILED", {})
    q = torch.zeros(2, 64, 576, dtype=torch.bfloat16)
    q4 = torch.zeros(2, 64, 512, dtype=torch.bfloat16)
    kv = torch.randn(100, 576).to(torch.bfloat16)
    v32 = quantize_kv(kv, 512, 128)
    v4 = quantize_kv(kv[:, :512].contiguous(), 448, 64)
    from servelab.kernels.sparse_mla.splitkv.lab import SHIPPED

    def ok(cfg, q, cache, d_v, tiles_per_split):
        return gluon_fp8.serves(plan_for(cfg, q, cache, d_v, tiles_per_split), SHIPPED)

    assert ok(_gluon(), q, v32, 512, 32) and ok(_gluon(), q4, v4, 512, 10)
    assert not ok(_gluon(3), q4, v4, 512, 10)  # a 3-deep ring: 250 KB of shared memory
    assert not ok(dataclasses.replace(_gluon(), block_n=32), q4, v4, 512, 10)
    assert not ok(_gluon(), q, quantize_kv(kv, 512, 32), 512, 32)  # 32-column scale tiles
    assert not ok(_gluon(), q, quantize_kv(kv, 512, 256), 512, 32)
    # (neither layout, or a rope dtype other than q's: refused before any variant is asked)
    with pytest.raises(ValueError, match="must lie within d_v=256"):
        ok(_gluon(), q4, v4, 256, 10)
    with pytest.raises(ValueError, match="16-bit part is torch.bfloat16, q is torch.float16"):
        ok(_gluon(), q4.half(), v4, 512, 10)
    rope = torch.randn(100, 68).to(torch.bfloat16)[:, :64]  # rows 136 B apart: not 16-B units
    odd = Fp8KVCache(data=v4.data, scale=v4.scale, rope=rope, tile=64)
    assert not ok(_gluon(), q4, odd, 512, 10)


def test_default_decisions_with_an_fp8_cache():
    """The FP8 rules of the defaults file (H200, docs/performance.md): the Gluon FP8 kernel
    from B = 1 with 128 heads and B = 2 with 32-64, with 16-bit partials from B = 8; the
    few-heads kernel from B = 8 at 32 heads and B = 2 at 16 or fewer; Triton rules for other
    scale tiles, at B = 1 below 128 heads, and where Gluon cannot run."""
    from servelab.kernels.sparse_mla.dispatch.defaults import default_config

    for b, h, want in [(8, 64, "gluon_fp8"), (128, 128, "gluon_fp8"), (1, 128, "gluon_fp8"),
                       (2, 64, "gluon_fp8"), (2, 32, "gluon_fp8"), (4, 32, "gluon_fp8"),
                       (8, 32, "gluon_nh_fp8"), (32, 32, "gluon_nh_fp8"), (8, 16, "gluon_nh_fp8"),
                       (64, 16, "gluon_nh_fp8"), (2, 16, "gluon_nh_fp8"),
                       (4, 8, "gluon_nh_fp8")]:  # fmt: skip
        for tile in (64, 128):
            cfg = default_config(b, h, 512, fp8_tile=tile)
            assert cfg.kernel == want, (b, h, tile, cfg)
            p16 = want == "gluon_fp8" and b >= 8  # 16-bit partials, measured from B = 8
            assert cfg.partial_dtype == ("input" if p16 else "fp32"), (b, h, cfg)
            assert default_config(b, h, 512, fp8_tile=tile, gluon=False).kernel.startswith(
                "triton")  # fmt: skip
        assert default_config(b, h, 512, fp8_tile=16).kernel.startswith("triton")
    for b, h in [(1, 64), (1, 32), (1, 16)]:
        assert default_config(b, h, 512, fp8_tile=64).kernel.startswith("triton")
