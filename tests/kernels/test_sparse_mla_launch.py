"""How a sparse MLA decode is launched: kernel choice (the Gluon kernel where it was measured
faster, the Triton kernels elsewhere), fallbacks when Gluon cannot compile, a compile check for
Hopper without a GPU, and replay inside a CUDA graph as the engine does. Numbers are checked
against the exact reference of mla_check (derived tolerances)."""

from __future__ import annotations

import os

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
    poisoned,
)

pytestmark = pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")
assert interpreted_kernels  # the module-scoped autouse fixture, imported to take effect here


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("shape", [(1, 64, 512, 512, 640), (4, 16, 576, 512, 2048),
                                   (32, 128, 576, 512, 2048)], ids=["v4flash_b1", "h16_b4",
                                                                   "v32_b32"])  # fmt: skip
@pytest.mark.parametrize("mode", ["auto", "kernel", "fused", "rp", "gluon"])
def test_replayed_inside_a_cuda_graph(shape, mode):
    """What the engine does: capture one call, then replay it with new queries and indices
    copied into the captured inputs. The PDL edge (auto at small B), the fused merge's
    counters (reset by each replay's last program) and the partial workspace allocated during
    capture must all hold over replays; outputs are NaN-poisoned before each replay."""
    import dataclasses

    from servelab.kernels.sparse_mla.splitkv import default_config, splitkv_decode

    b, h, d_qk, d_v, topk = shape
    dtype = torch.bfloat16
    q, kv, idx = make("cuda", dtype, b, h, d_qk, topk, t=70_000, pad_frac=0.05, seed=21)
    cfg = default_config(b, h, d_qk, dtype)
    if mode == "rp":
        cfg = dataclasses.replace(cfg, block_n=32, kernel="rp")
    elif mode == "gluon":
        if not gluon_here():
            pytest.skip("the Gluon kernel needs a Hopper GPU")
        cfg = dataclasses.replace(cfg, block_h=64, block_n=32, num_warps=8, num_stages=3,
                                  kernel="gluon")  # fmt: skip
    else:
        cfg = dataclasses.replace(cfg, merge=mode)
    out, lse = poisoned(b, h, d_v, dtype, "cuda")

    def call():
        splitkv_decode(q, kv, idx, d_qk**-0.5, d_v, config=cfg, out=out, lse=lse)

    # seed 24: an all-padding request inside the graph (out 0, lse -inf)
    replays = ((22, None), (23, None), (24, 0))
    path = check_graph_replays(call, q, idx, out, lse, kv, d_v, replays, f"{mode} {shape}")
    if mode in ("kernel", "fused") and path["merge"] != "single":
        assert path["merge"] == mode, path
    # The Gluon kernels (the default from B = 8 on Hopper) have no fused merge: tl runs then.
    gluon_ran = cfg.kernel in ("gluon", "ws", "nh") and mode != "fused" and gluon_here()
    want = {"rp": "16bit_rp", "gluon": "16bit_gluon", "ws": "16bit_ws", "nh": "16bit_nh"}
    assert path["split"] == want.get(cfg.kernel if gluon_ran or mode == "rp" else "tl",
                                     "16bit"), path  # fmt: skip


_GLUON_COMPILE = """
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from servelab.kernels.sparse_mla import splitkv_gluon
if not splitkv_gluon.AVAILABLE:
    print(json.dumps({"skip": "this Triton has no Gluon"})); sys.exit(0)
from triton.experimental.gluon._runtime import GluonASTSource
d_tail, bn, nbuf = map(int, sys.argv[1:4])
k = splitkv_gluon._sparse_mla_split_gluon_kernel
ce = dict(D_V=512, D_TAIL=d_tail, BLOCK_H=64, BLOCK_N=bn, BLOCK_T=max(d_tail, 16), NBUF=nbuf,
          MAX_T=2048 // bn, num_warps=8, DROP=0)  # V3.2's topk 2048 in one split
ptrs = dict(q_ptr="*bf16", kv_ptr="*bf16", idx_ptr="*i32", o_ptr="*fp32", lse_ptr="*fp32")
sig = {n: "constexpr" if n in ce else ptrs.get(n, "fp32" if n == "scale_log2" else "i32")
       for n in k.arg_names}
# what the launcher specializes: 16-aligned pointers, and the int arguments that are multiples
# of 16 at this shape (B = 64, H = 128, one split; KV/q strides passed in 16-byte units)
d_qk = 512 + d_tail
vals = dict(H=128, topk=2048, tiles_per_split=2048 // bn, stride_qb8=128 * d_qk // 8,
            stride_qh8=d_qk // 8, stride_kvt8=d_qk // 8, stride_ib=2048, stride_ob=128 * 512,
            stride_os=0, stride_oh=512, stride_lb=128, stride_ls=0)
attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(k.arg_names)
         if sig[n].startswith("*") or (n in vals and vals[n] % 16 == 0)}
c = triton.compile(GluonASTSource(k, sig, ce, attrs), target=GPUTarget("cuda", 90, 32),
                   options=dict(num_warps=8))
ptx = c.asm["ptx"]
print(json.dumps({"shared": c.metadata.shared, "wgmma": ptx.count("wgmma.mma_async"),
                  "cp_async": ptx.count("cp.async.c")}))
"""


@pytest.mark.parametrize("d_tail, bn, nbuf", [(0, 32, 3), (64, 32, 3), (0, 64, 2), (64, 64, 2)],
                         ids=["v4_bn32", "v32_bn32", "v4_bn64", "v32_bn64"])  # fmt: skip
def test_gluon_kernel_compiles_for_hopper(d_tail, bn, nbuf):
    """Gluon has no CPU interpreter, so without a GPU the kernel is at least compiled for
    sm_90a (the H200) by the installed Triton, in a fresh process (this module sets
    TRITON_INTERPRET, under which Gluon cannot compile): the code must lower to wgmma and
    cp.async, and the q tile plus the KV ring must fit Hopper's 227 KB of shared memory per
    block. The GPU tests check its numbers."""
    import json
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _GLUON_COMPILE, str(d_tail), str(bn), str(nbuf)],
                       env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    if "skip" in got:
        pytest.skip(got["skip"])
    assert got["wgmma"] > 0 and got["cp_async"] > 0, got
    ring = nbuf * bn * (512 + d_tail) * 2 + 64 * 512 * 2  # KV ring + q (its tail: registers)
    assert ring <= got["shared"] <= 227 * 1024, got


@pytest.mark.parametrize("device", DEVICES)
def test_gluon_compile_failure_falls_back_to_the_triton_kernel(device, monkeypatch):
    """Gluon is experimental: if the installed Triton rejects the kernel, the launch must run
    the tl kernel (correct numbers, LAST_PATH says so), warn once, and not retry the compile
    on every later call. Simulated with a kernel whose launch raises as a failed compile does;
    on the CPU the launch is also made reachable (no Hopper there)."""
    from servelab.kernels.sparse_mla import splitkv_gluon
    from servelab.kernels.sparse_mla.splitkv import LAST_PATH, SplitConfig, splitkv_decode

    broken = BrokenKernel()
    monkeypatch.setattr(splitkv_gluon, "_sparse_mla_split_gluon_kernel", broken, raising=False)
    monkeypatch.setattr(splitkv_gluon, "FAILED", {})
    if not gluon_here():  # the CPU, or a GPU without Gluon: make the launch reachable
        monkeypatch.setattr(splitkv_gluon, "serves", lambda cfg, q, kv, d_v, tps, drop="": (
            splitkv_gluon.key(splitkv_gluon.consts(cfg, d_v, kv.shape[1] - d_v, tps, drop), q)
            not in splitkv_gluon.FAILED))  # fmt: skip
    dtype = torch.float16
    b, h, d_qk, d_v, topk = 3, 20, 48, 32, 70
    q, kv, idx = make(device, dtype, b, h, d_qk, topk, seed=5)
    out_ex, lse_ex, out_tol, lse_tol = bounds(q, kv, idx, d_qk**-0.5, d_v, dtype)
    cfg = SplitConfig(64, 16, 8, 2, kernel="gluon")
    with pytest.warns(UserWarning, match="Gluon split kernel did not compile"):
        out, lse = poisoned(b, h, d_v, dtype, device)
        o, lg = splitkv_decode(q, kv, idx, d_qk**-0.5, d_v, config=cfg, out=out, lse=lse)
    assert LAST_PATH["split"] == "16bit" and len(broken.tries) == 1, (LAST_PATH, broken.tries)
    assert_close("fallback out", o, out_ex, out_tol)
    assert_close("fallback lse", lg, lse_ex, lse_tol)
    out, lse = poisoned(b, h, d_v, dtype, device)
    o, lg = splitkv_decode(q, kv, idx, d_qk**-0.5, d_v, config=cfg, out=out, lse=lse)
    assert len(broken.tries) == 1, "the failed compile was retried"
    assert_close("fallback again out", o, out_ex, out_tol)


@pytest.mark.parametrize("device", DEVICES)
def test_ws_compile_failure_is_tried_once(device, monkeypatch):
    """The warp-specialised kernel's launch picks its grid order per launch (HEADS_FIRST,
    splitkv_gluon.grid_order, which clears HB_FAST for one head block): a failed compile must
    be recorded under the key serves() asks about, so that later calls run the Triton kernel
    without compiling again. Simulated as above; serves() itself runs (Hopper assumed on the
    CPU)."""
    from servelab.kernels.sparse_mla import splitkv_gluon, splitkv_gluon_ws
    from servelab.kernels.sparse_mla.splitkv import GLUON_WS, LAST_PATH, splitkv_decode

    broken = BrokenKernel()
    monkeypatch.setattr(splitkv_gluon_ws, "_sparse_mla_split_gluon_ws_kernel", broken,
                        raising=False)  # fmt: skip
    monkeypatch.setattr(splitkv_gluon_ws, "HEADS_FIRST", True)
    monkeypatch.setattr(splitkv_gluon, "FAILED", {})
    if not gluon_here():
        monkeypatch.setattr(splitkv_gluon, "gluon_device", lambda device=None: True)
    dtype = torch.float16
    b, h, d_qk, d_v, topk = 3, 20, 192, 128, 70  # one head block: B first
    q, kv, idx = make(device, dtype, b, h, d_qk, topk, seed=6)
    out_ex, lse_ex, out_tol, lse_tol = bounds(q, kv, idx, d_qk**-0.5, d_v, dtype)
    with pytest.warns(UserWarning, match="did not compile"):
        o, lg = splitkv_decode(q, kv, idx, d_qk**-0.5, d_v, config=GLUON_WS, num_splits=1)
    assert LAST_PATH["split"] == "16bit" and len(broken.tries) == 1, (LAST_PATH, broken.tries)
    assert_close("ws fallback out", o, out_ex, out_tol)
    o, lg = splitkv_decode(q, kv, idx, d_qk**-0.5, d_v, config=GLUON_WS, num_splits=1)
    assert len(broken.tries) == 1, "the failed compile was retried"
    assert_close("ws fallback again out", o, out_ex, out_tol)


class _TooBig:
    """Stands in for the Triton split kernel: a launch with BLOCK_N = `block_n` raises as one
    needing more shared memory than the GPU has (Triton's OutOfResources), others run."""

    def __init__(self, real, block_n):
        self.real, self.block_n, self.tiles = real, block_n, []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.tiles.append((kwargs["BLOCK_H"], kwargs["BLOCK_N"]))
            if kwargs["BLOCK_N"] == self.block_n:
                from triton.runtime.errors import OutOfResources

                raise OutOfResources(264448, 232448, "shared memory")
            return self.real[grid](*args, **kwargs)

        return launch


@pytest.mark.parametrize("device", DEVICES)
def test_triton_kernel_on_a_gluon_geometry_that_does_not_fit(device, monkeypatch):
    """An explicit Gluon config this launch cannot serve runs a Triton kernel on its geometry;
    where that geometry does not fit the GPU's shared memory (seen on the H200: the few-heads
    FP8 geometry on the Triton FP8 kernel), the launch must run the Triton default's geometry
    with a warning, not end in a traceback. An explicit Triton geometry that does not fit is a
    one-line error naming the geometry. Simulated (no interpreter runs out of memory)."""
    from servelab.kernels.sparse_mla import splitkv, splitkv_gluon
    from servelab.kernels.sparse_mla.splitkv import (
        LAST_PATH,
        SplitConfig,
        default_config,
        nh_config,
        splitkv_decode,
    )

    monkeypatch.setattr(splitkv_gluon, "gluon_device", lambda device=None: False)
    dtype = torch.float16
    b, h, d_qk, d_v, topk = 3, 12, 192, 128, 70
    q, kv, idx = make(device, dtype, b, h, d_qk, topk, seed=4)
    out_ex, lse_ex, out_tol, lse_tol = bounds(q, kv, idx, d_qk**-0.5, d_v, dtype)
    tl_cfg = default_config(b, h, d_qk, dtype, gluon=False)
    assert tl_cfg.block_n != 64  # (the stand-in fails 64-token tiles only)
    stand_in = _TooBig(splitkv._sparse_mla_split_kernel, 64)
    monkeypatch.setattr(splitkv, "_sparse_mla_split_kernel", stand_in)
    out, lse = poisoned(b, h, d_v, dtype, device)
    with pytest.warns(UserWarning, match="nh config's geometry does not fit here"):
        o, lg = splitkv_decode(q, kv, idx, d_qk**-0.5, d_v, config=nh_config(h, 3), out=out,
                               lse=lse)  # fmt: skip
    want = (tl_cfg.block_h, tl_cfg.block_n)
    assert stand_in.tiles[0] == (16, 64) and stand_in.tiles[-1] == want, stand_in.tiles
    assert LAST_PATH["tile"] == f"{tl_cfg.block_h}x{tl_cfg.block_n}", LAST_PATH
    assert_close("too-big fallback out", o, out_ex, out_tol)
    assert_close("too-big fallback lse", lg, lse_ex, lse_tol)
    with pytest.raises(ValueError, match=r"geometry \(tiles 16x64, 2 stages\) needs more shared"):
        splitkv_decode(q, kv, idx, d_qk**-0.5, d_v, config=SplitConfig(16, 64, 4, 2))


def test_default_gluon_that_fails_to_compile_runs_the_triton_default(monkeypatch):
    """With no config, a Gluon compile failure must fall back to the tl kernel's own default
    geometry for that shape (16-head tiles for H = 32), not run the Gluon tile (64 heads) on
    the tl kernel; simulated as in the test above (Gluon made reachable, its launch raising)."""
    from servelab.kernels.sparse_mla import splitkv_gluon, splitkv_gluon_ws
    from servelab.kernels.sparse_mla.splitkv import LAST_PATH, splitkv_decode

    device = DEVICES[0]  # the default from B = 8 is the warp-specialised kernel
    monkeypatch.setattr(splitkv_gluon_ws, "_sparse_mla_split_gluon_ws_kernel", BrokenKernel(),
                        raising=False)  # fmt: skip
    monkeypatch.setattr(splitkv_gluon, "FAILED", {})
    monkeypatch.setattr(splitkv_gluon, "gluon_device", lambda device=None: True)
    monkeypatch.setattr(splitkv_gluon_ws, "serves", lambda cfg, q, kv, d_v, tps, drop="": (
        cfg.kernel == "ws" and not splitkv_gluon.FAILED))  # fmt: skip
    b, h, d_qk, d_v, topk = 32, 32, 48, 32, 40
    q, kv, idx = make(device, torch.float16, b, h, d_qk, topk, seed=9)
    out_ex, lse_ex, out_tol, lse_tol = bounds(q, kv, idx, d_qk**-0.5, d_v, torch.float16)
    with pytest.warns(UserWarning, match="did not compile"):
        o, lg = splitkv_decode(q, kv, idx, d_qk**-0.5, d_v)
    assert LAST_PATH["split"] == "16bit" and LAST_PATH["tile"] == "16x32", LAST_PATH  # NARROW_TP
    assert_close("default fallback out", o, out_ex, out_tol)
    assert_close("default fallback lse", lg, lse_ex, lse_tol)


def test_default_config_takes_gluon_where_it_was_measured_faster():
    """H200 tables (docs/performance.md): the warp-specialised Gluon kernel with a 16-bit cache
    and 16-bit partials from B = 8 (B = 2 with 128 heads, B = 1 with 128 heads on 576-wide
    rows) for 17-128 heads; the few-heads kernel from B = 4 with <= 16 heads (B = 2 on
    576-wide rows); the tl kernels below; never Gluon on a device without it. (The FP8
    cache's rule: test_sparse_mla_fp8_gluon.py.)"""
    from servelab.kernels.sparse_mla.splitkv import default_config

    bf16 = torch.bfloat16
    for b, h, want in [(32, 64, "ws"), (128, 128, "ws"), (64, 32, "ws"), (8, 64, "ws"),
                       (16, 64, "ws"), (8, 32, "ws"), (8, 20, "ws"), (8, 128, "ws"),
                       (4, 128, "ws"), (2, 128, "ws"), (7, 64, "tl"), (4, 64, "tl"),
                       (4, 32, "tl"), (64, 16, "nh"), (8, 16, "nh"), (4, 16, "nh"),
                       (4, 8, "nh"), (1, 64, "tl"), (1, 16, "rp"), (2, 16, "tl"),
                       (1, 128, "tl")]:  # fmt: skip
        cfg = default_config(b, h, 512, bf16, gluon=True)
        assert cfg.kernel == want, (b, h)
        assert cfg.partial_dtype == ("input" if want == "ws" else "fp32"), (b, h, cfg)
        assert default_config(b, h, 512, bf16, gluon=False).kernel in ("tl", "rp")
    for b, h, want in [(1, 128, "ws"), (2, 128, "ws"), (1, 16, "rp"), (2, 16, "nh"),
                       (2, 8, "nh"), (1, 64, "tl")]:  # V3.2's 576-wide rows  # fmt: skip
        assert default_config(b, h, 576, bf16, gluon=True).kernel == want, (b, h)


def test_gluon_can_be_switched_off_for_an_ab(monkeypatch):
    """SERVELAB_SPARSE_MLA_GLUON=0 makes a Hopper machine choose the Triton default, so the
    engine's splitkv backend can be A/B-ed with and without the Gluon kernel."""
    from servelab.kernels.sparse_mla import splitkv_gluon
    from servelab.kernels.sparse_mla.splitkv import default_config

    monkeypatch.setattr(splitkv_gluon, "AVAILABLE", True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(splitkv_gluon, "_is_hopper", lambda index: True)
    monkeypatch.delenv("SERVELAB_SPARSE_MLA_GLUON", raising=False)
    assert default_config(64, 64, 512, torch.bfloat16).kernel == "ws"
    monkeypatch.setenv("SERVELAB_SPARSE_MLA_GLUON", "0")
    assert default_config(64, 64, 512, torch.bfloat16).kernel == "tl"
