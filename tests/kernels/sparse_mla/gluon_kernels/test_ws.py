"""The warp-specialised Gluon split kernel (gluon_ws.py: loader, scorer and
second-half partitions handing tiles over by mbarriers): numbers against the exact reference
(mla_check's derived bounds), replay in a CUDA graph, and a compile for Hopper without a GPU.
Gluon has no CPU interpreter: the numeric tests need a Hopper GPU."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mla_check import (
    assert_close,
    bounds,
    check_graph_replays,
    interpreted_kernels,
    make,
    needs_hopper,
    partials_rounded,
    poisoned,
    real_shapes,
)

pytestmark = pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")
assert interpreted_kernels  # the module-scoped autouse fixture, imported to take effect here


# (tokens per tile, K buffers): the geometries bench_sparse_mla_geometry.py times
WS_GEOMETRIES = [(64, 2), (32, 4), (32, 3), (16, 8)]


def _refs(q, kv, idx, d_v, dtype):
    """bounds() without and with 16-bit partials (the exact result and its tolerances)."""
    return {r: bounds(q, kv, idx, q.shape[-1] ** -0.5, d_v, dtype, partial_rounded=r)
            for r in (False, True)}  # fmt: skip


def _gluon_ws():
    from servelab.kernels.sparse_mla.dispatch.defaults import geometry

    return geometry("gluon_ws")


def _check(q, kv, idx, d_v, splits, tag, cfg, refs, workspace=None, lab=None):
    """One launch against refs[whether it kept 16-bit partials] (_refs())."""
    from servelab.kernels.sparse_mla.dispatch.launch import splitkv_launch

    b, h, d_qk = q.shape
    scale = d_qk**-0.5
    out, lse = poisoned(b, h, d_v, q.dtype, q.device)
    run = splitkv_launch(q, kv, idx, scale, d_v, config=cfg, num_splits=splits, out=out,
                         lse=lse, workspace=workspace, lab=lab)  # fmt: skip
    ran = run.ran
    assert ran.variant == "gluon_ws", (tag, ran)
    if ran.merge != "single" and workspace is None:  # the config's partials (one split: none)
        want = q.dtype if cfg.partial_dtype == "input" else torch.float32
        assert ran.partials == str(want).removeprefix("torch."), (tag, ran)
    out_ex, lse_ex, out_tol, lse_tol = refs[partials_rounded(ran)]
    assert_close(f"{tag} out", run.out, out_ex, out_tol)
    assert_close(f"{tag} lse", run.lse, lse_ex, lse_tol)
    return run.out, run.lse


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("d_qk, d_v", [(128, 128), (192, 128), (576, 512)],
                         ids=["no_tail", "tail", "v32_dims"])  # fmt: skip
def test_toy_shapes_splits_padding_duplicates(d_qk, d_v):
    """topk = 300 (a tail tile), 20% padding, duplicated rows, one all-padding request,
    split counts 1-8 (splits shorter than the K ring, tiles past the split, and at 8 splits
    programs past the last tile, which must write (0, -inf) for the merge), both 16-bit
    dtypes, every measured tile/ring geometry; outputs NaN-poisoned before each call."""
    GLUON_WS = _gluon_ws()
    for dtype in (torch.bfloat16, torch.float16):
        q, kv, idx = make("cuda", dtype, 4, 20, d_qk, 300, t=900, seed=3)
        idx[2, 100:160] = idx[2, 0]
        idx[1] = -1
        refs = _refs(q, kv, idx, d_v, dtype)
        for bn, nk in WS_GEOMETRIES:
            cfg = dataclasses.replace(GLUON_WS, block_n=bn, num_stages=nk)
            for splits in (1, 2, 3, 5, 8):
                tag = f"{d_qk} {dtype} bn{bn} nk{nk} s{splits}"
                o, lg = _check(q, kv, idx, d_v, splits, tag, cfg, refs)
                assert torch.all(o[1] == 0) and torch.all(torch.isneginf(lg[1]))


@pytest.mark.gpu
@needs_hopper
@real_shapes
def test_real_shapes(shape):
    GLUON_WS = _gluon_ws()
    b, h, d_qk, d_v, topk = shape
    for dtype in (torch.bfloat16, torch.float16):
        q, kv, idx = make("cuda", dtype, b, h, d_qk, topk, t=70_000, pad_frac=0.05, seed=11)
        refs = _refs(q, kv, idx, d_v, dtype)
        for bn, nk in WS_GEOMETRIES[:2]:
            cfg = dataclasses.replace(GLUON_WS, block_n=bn, num_stages=nk)
            for splits in (None, 3):
                _check(q, kv, idx, d_v, splits, f"{shape} {dtype} bn{bn} s{splits}", cfg, refs)


@pytest.mark.gpu
@needs_hopper
def test_replayed_inside_a_cuda_graph():
    from servelab.kernels.sparse_mla.dispatch.launch import splitkv_launch

    b, h, d_qk, d_v, topk = 16, 64, 512, 512, 640
    dtype = torch.bfloat16
    q, kv, idx = make("cuda", dtype, b, h, d_qk, topk, t=70_000, pad_frac=0.05, seed=21)
    out, lse = poisoned(b, h, d_v, dtype, "cuda")

    def call():
        return splitkv_launch(q, kv, idx, d_qk**-0.5, d_v, config=_gluon_ws(), out=out, lse=lse)

    ran = check_graph_replays(call, q, idx, out, lse, kv, d_v, ((22, 3), (23, 3)), "ws")
    assert ran.variant == "gluon_ws", ran


@pytest.mark.gpu
@needs_hopper
def test_grid_order_leaves_results_identical(monkeypatch):
    """Heads first (the grid (head blocks, B, splits), where the programs outnumber the SMs,
    so that a request's two 64-head programs run side by side) changes only where programs
    run: at 128 heads, with one split at large B and many splits at small B, the results
    equal those of the (B, head blocks, splits) grid bit for bit, and the exact reference;
    the phase trace still gets one row per (request, head block, split). With one wave of
    programs the grid keeps B first."""
    from servelab.kernels.sparse_mla.dispatch.launch import splitkv_launch
    from servelab.kernels.sparse_mla.gluon_kernels import common as gluon_common
    from servelab.kernels.sparse_mla.gluon_kernels import ws
    from servelab.kernels.sparse_mla.splitkv.lab import Lab

    GLUON_WS = _gluon_ws()
    grids = []
    order = gluon_common.grid_order
    monkeypatch.setattr(gluon_common, "grid_order",
                        lambda kc, grid, sms: grids.append(order(kc, grid, sms)) or grids[-1])  # fmt: skip
    n_sms = torch.cuda.get_device_properties(0).multi_processor_count
    h, d_qk, d_v, topk = 128, 576, 512, 1200
    for b, splits in ((n_sms // 2 + 4, 1), (8, n_sms // 16 + 1), (3, 2)):
        q, kv, idx = make("cuda", torch.bfloat16, b, h, d_qk, topk, t=50_000, pad_frac=0.1,
                          seed=8)  # fmt: skip
        idx[2] = -1  # an all-padding request
        refs = _refs(q, kv, idx, d_v, q.dtype)
        got = {}
        for first in (False, True):
            # partials poisoned too: a program that never ran must not pass on the last run's
            ws_ = None if splits == 1 else (
                torch.full((b, splits, h, d_v), float("nan"), dtype=q.dtype, device="cuda"),
                torch.full((b, splits, h), float("nan"), device="cuda"))  # fmt: skip
            got[first] = _check(q, kv, idx, d_v, splits, f"b{b} s{splits} heads_first={first}",
                                GLUON_WS, refs, ws_, Lab(heads_first=first))  # fmt: skip
            many = b * 2 * splits > n_sms
            assert grids[-1] == ((2, b, splits) if first and many else (b, 2, splits)), grids
        assert torch.equal(got[True][0], got[False][0]), (b, splits)
        assert torch.equal(got[True][1], got[False][1]), (b, splits)
        tr = torch.full((b * 2 * splits * ws.TRACE_COLS,), -1, dtype=torch.int64, device="cuda")
        splitkv_launch(q, kv, idx, d_qk**-0.5, d_v, config=GLUON_WS, num_splits=splits,
                       lab=Lab(trace=tr))  # fmt: skip
        entry = tr.view(-1, ws.TRACE_COLS)[:, ws.TRACE_LAYOUT["entry"]]
        assert torch.all(entry > 0), (b, splits, entry)


@pytest.mark.gpu
@needs_hopper
def test_phase_trace():
    """The trace (gluon_ws.TRACE_LAYOUT) leaves the results as they are, and every
    program's stamps are on one clock in the kernel's order: entry <= first indices / q <= each
    tile's k_ready seen <= its scores <= its P V, tiles in order, the end after the last tile,
    the stores after the end; SM ids in range; tiles past TRACE_TILES not stamped."""
    from servelab.kernels.sparse_mla.dispatch.launch import splitkv_decode
    from servelab.kernels.sparse_mla.gluon_kernels.ws import TRACE_COLS, TRACE_LAYOUT, TRACE_TILES
    from servelab.kernels.sparse_mla.splitkv.lab import Lab

    GLUON_WS = _gluon_ws()
    L = TRACE_LAYOUT
    b, h, d_qk, d_v, topk, splits = 3, 64, 576, 512, 2048, 1  # 32 tiles: 16 past the trace
    q, kv, idx = make("cuda", torch.bfloat16, b, h, d_qk, topk, t=70_000, pad_frac=0.05, seed=5)
    scale = d_qk**-0.5
    ref = splitkv_decode(q, kv, idx, scale, d_v, config=GLUON_WS, num_splits=splits)
    tr = torch.full((b * splits * TRACE_COLS,), -1, dtype=torch.int64, device="cuda")
    got = splitkv_decode(q, kv, idx, scale, d_v, config=GLUON_WS, num_splits=splits,
                         lab=Lab(trace=tr))  # fmt: skip
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    tr = tr.view(-1, TRACE_COLS).cpu()
    n_sms = torch.cuda.get_device_properties(0).multi_processor_count
    n_local = 32
    unused = [c for c in range(TRACE_COLS) if c not in L.values()
              and not any(L[k] <= c < L[k] + TRACE_TILES for k in ("landed", "ready", "scored",
                                                                  "pv1", "p_ready", "pv2"))]  # fmt: skip
    assert unused and torch.all(tr[:, unused] == -1)
    for row in tr:
        assert 0 <= row[L["sm"]] < n_sms
        e = row[L["entry"]]
        assert e > 0 and row[L["q"]] >= e and row[L["idx0"]] >= e
        assert row[L["q"]] >= row[L["idx0"]]  # q_after_indices: q issued once idx0 is in
        prev = e
        for j in range(min(n_local, TRACE_TILES)):
            steps = [row[L["landed"] + j], row[L["ready"] + j], row[L["scored"] + j],
                     row[L["pv1"] + j]]  # fmt: skip
            assert all(x >= prev for x in steps[1:]) and steps == sorted(steps), (j, steps)
            assert row[L["p_ready"] + j] >= row[L["scored"] + j]
            assert row[L["pv2"] + j] >= row[L["p_ready"] + j]
            prev = steps[-1]
        assert row[L["scorer_end"]] >= prev and row[L["scorer_stored"]] >= row[L["scorer_end"]]
        assert row[L["second_end"]] >= row[L["pv2"] + TRACE_TILES - 1]
        assert row[L["second_stored"]] >= row[L["second_end"]]
        assert row[L["loader_end"]] >= row[L["landed"] + TRACE_TILES - 1]
    with pytest.raises(ValueError, match="contiguous int64"):
        splitkv_decode(q, kv, idx, scale, d_v, config=GLUON_WS, num_splits=splits,
                       lab=Lab(trace=torch.zeros(8, dtype=torch.int64, device="cuda")))  # fmt: skip


def test_split_trace_summary_on_absolute_timestamps():
    """benchmarks/sparse_mla_traces.py's summary of a split trace, on hand-made stamps at the
    globaltimer's real magnitude (~1.8e18 ns, 32 ns steps): the phases come out to the
    nanosecond (a float64 of the absolute time would round them to 256 ns), unstamped (-1)
    entries are skipped, and a program with fewer tiles counts only its own."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "benchmarks"))
    import sparse_mla_traces as probes

    from servelab.kernels.sparse_mla.gluon_kernels.ws import TRACE_COLS, TRACE_LAYOUT

    L = TRACE_LAYOUT
    base = 1_764_000_000_000_000_032
    tr = torch.full((2, TRACE_COLS), -1, dtype=torch.int64)
    n_local = torch.tensor([3, 1])
    for p, (entry, n) in enumerate(((0, 3), (96, 1))):
        row = tr[p]
        row[L["sm"]] = p
        for name, t in (("entry", 0), ("idx0", 800), ("q", 1504), ("scorer_end", 0),
                        ("second_end", 0)):  # fmt: skip
            row[L[name]] = base + entry + t
        for j in range(n):
            t = base + entry + 2016 + 2304 * j
            row[L["landed"] + j], row[L["ready"] + j] = t, t + 32
            row[L["scored"] + j], row[L["pv1"] + j] = t + 32 + 768, t + 32 + 768 + 1024
        row[L["scorer_end"]] = row[L["pv1"] + n - 1]
        row[L["scorer_stored"]] = row[L["scorer_end"]] + 1792
        row[L["second_end"]] = row[L["scorer_end"]] + 64
        row[L["second_stored"]] = row[L["second_end"]] + 2048
    got = probes._split_trace_summary(tr, n_local)
    end0 = 2016 + 2304 * 2 + 32 + 1792 + 64 + 2048  # program 0: its second half stores last
    end1 = 2016 + 32 + 1792 + 64 + 2048
    # Medians of two programs are the lower value: program 1 (one tile) for loop and program.
    # Medians of two programs are the lower value: program 1's (one tile) for loop and program.
    want = dict(idx0=0.8, q=1.504, ready0=2.048, qk=0.768, softmax_pv=1.024,
                wait=(2304 - 1792) / 1e3, land_gap=2.304, entry_spread=0.096,
                span=end0 / 1e3, program=end1 / 1e3, loop=1.792, store=1.792,
                second_store=2.048)  # fmt: skip
    for k, v in want.items():
        assert got[k] == pytest.approx(v, abs=1e-9), (k, got[k], v)


_COMPILE = """
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from servelab.kernels.sparse_mla.gluon_kernels import common as gluon_common
if not gluon_common.AVAILABLE:
    print(json.dumps({"skip": "this Triton has no Gluon"})); sys.exit(0)
from triton.experimental.gluon._runtime import GluonASTSource
from servelab.kernels.sparse_mla.gluon_kernels import ws as m
d_tail, bn, nk, trace = map(int, sys.argv[1:5])
k = m._sparse_mla_split_gluon_ws_kernel
ce = dict(D_V=512, D_TAIL=d_tail, BLOCK_H=64, BLOCK_N=bn, BLOCK_T=max(d_tail, 16), NK=nk,
          DROP=0, SECOND_REGS=168, LOADER_REGS=88, num_warps=4, TRACE=bool(trace), STAGED=True,
          Q_LATE=True, HB_FAST=True)
ptrs = dict(q_ptr="*bf16", kv_ptr="*bf16", idx_ptr="*i32", o_ptr="*bf16", lse_ptr="*fp32",
            trace_ptr="*i64")
if not trace:
    ce["trace_ptr"] = None
sig = {n: "constexpr" if n in ce else ptrs.get(n, "fp32" if n == "scale_log2" else "i32")
       for n in k.arg_names}
d_qk = 512 + d_tail
vals = dict(H=64, topk=2048, tiles_per_split=32, stride_qb8=64 * d_qk // 8,
            stride_qh8=d_qk // 8, stride_kvt8=d_qk // 8, stride_ib=2048, stride_ob=64 * 512,
            stride_os=0, stride_oh=512, stride_lb=64, stride_ls=0)
attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(k.arg_names)
         if sig[n].startswith("*") or (n in vals and vals[n] % 16 == 0)}
c = triton.compile(GluonASTSource(k, sig, ce, attrs), target=GPUTarget("cuda", 90, 32),
                   options=dict(num_warps=4))
ptx = c.asm["ptx"]
print(json.dumps({"shared": c.metadata.shared, "wgmma": ptx.count("wgmma.mma_async"),
                  "mbarrier_wait": ptx.count("mbarrier.try_wait"),
                  "setmaxnreg": ptx.count("setmaxnreg"), "smem_est": m.smem_bytes(ce),
                  "globaltimer": ptx.count("%globaltimer"), "smid": ptx.count("%smid")}))
"""


@pytest.mark.parametrize("d_tail, bn, nk, trace", [(0, 64, 2, 0), (64, 64, 2, 0), (0, 32, 4, 0),
                                                   (64, 64, 2, 1)],
                         ids=["v4", "v32", "v4_bn32_lagged", "v32_traced"])  # fmt: skip
def test_compiles_for_hopper(d_tail, bn, nk, trace):
    """Without a GPU: compile for sm_90a in a fresh process (the default geometry, a 4-buffer
    ring whose loader lags by two tiles, and the phase trace): wgmma, mbarrier waits and the
    partitions' register moves (setmaxnreg) must be there, shared memory must fit 227 KB
    within the launcher's estimate (which decides serves()), and the timer is read only when
    traced (all three partitions stamp: more than one read)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _COMPILE, str(d_tail), str(bn), str(nk),
                        str(trace)], env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    if "skip" in got:
        pytest.skip(got["skip"])
    assert got["wgmma"] > 0 and got["mbarrier_wait"] > 0 and got["setmaxnreg"] > 0, got
    assert 2 * (64 + nk * bn) * 512 < got["shared"] <= min(got["smem_est"], 227 * 1024), got
    if trace:
        assert got["globaltimer"] >= 10 and got["smid"] == 1, got
    else:
        assert got["globaltimer"] == 0 and got["smid"] == 0, got
