"""How a sparse MLA decode is launched: the defaults file's rules (the Gluon kernels where they
were measured faster, the Triton kernels elsewhere), what a failing variant does (named: the
call raises; a default: the next rule runs, and the record says so), and replay inside a CUDA
graph as the engine does. Numbers are checked against the exact reference of mla_check
(derived tolerances)."""

from __future__ import annotations

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
@pytest.mark.parametrize("mode", ["default", "kernel", "pdl", "rp"])
def test_replayed_inside_a_cuda_graph(shape, mode):
    """What the engine does: capture one call, then replay it with new queries and indices
    copied into the captured inputs. The default choice, the PDL edge and the partial
    workspace allocated during capture must hold over replays; outputs are NaN-poisoned
    before each replay, and the captured launch must be the one run before capture."""
    import dataclasses

    from servelab.kernels.sparse_mla.dispatch.defaults import default_config
    from servelab.kernels.sparse_mla.dispatch.launch import splitkv_launch

    b, h, d_qk, d_v, topk = shape
    dtype = torch.bfloat16
    q, kv, idx = make("cuda", dtype, b, h, d_qk, topk, t=70_000, pad_frac=0.05, seed=21)
    cfg = None
    if mode == "rp":
        cfg = dataclasses.replace(default_config(b, h, d_qk, gluon=False), block_n=32,
                                  kernel="triton_rp")  # fmt: skip
    elif mode != "default":
        cfg = dataclasses.replace(default_config(b, h, d_qk, gluon=False), merge=mode)
    out, lse = poisoned(b, h, d_v, dtype, "cuda")

    def call():
        return splitkv_launch(q, kv, idx, d_qk**-0.5, d_v, config=cfg, out=out, lse=lse)

    # seed 24: an all-padding request inside the graph (out 0, lse -inf)
    replays = ((22, None), (23, None), (24, 0))
    ran = check_graph_replays(call, q, idx, out, lse, kv, d_v, replays, f"{mode} {shape}")
    if cfg is not None:
        assert ran.variant == cfg.kernel, ran
        assert mode == "rp" or ran.merge in ("single", mode), ran  # (rp: "auto", any merge)
    else:
        assert ran.variant == default_config(b, h, d_qk, gluon=gluon_here()).kernel, ran


def _reachable_ws(monkeypatch, gluon_ws, gluon_common):
    """gluon_ws made reachable where there is no Hopper (the CPU): serves() as written but for
    the device check."""
    if not gluon_here():
        monkeypatch.setattr(gluon_common, "gluon_device", lambda device=None: True)


@pytest.mark.parametrize("device", DEVICES)
def test_named_variant_that_fails_to_compile_raises(device, monkeypatch):
    """Gluon is experimental: a config that names gluon_ws, whose compile fails here, must
    raise (a named variant never silently becomes another), warn once with the compiler's
    error, and not compile again on the next call (which raises at once). The failure is
    recorded under the key serves() asks about although the launch clears HB_FAST for one
    head block (gluon_common.grid_order). Simulated with a kernel whose launch raises as a
    failed compile does."""
    from servelab.kernels.sparse_mla.dispatch.defaults import geometry
    from servelab.kernels.sparse_mla.dispatch.launch import splitkv_decode
    from servelab.kernels.sparse_mla.gluon_kernels import common as gluon_common
    from servelab.kernels.sparse_mla.gluon_kernels import ws as gluon_ws

    broken = BrokenKernel()
    monkeypatch.setattr(gluon_ws, "_sparse_mla_split_gluon_ws_kernel", broken, raising=False)
    monkeypatch.setattr(gluon_common, "FAILED", {})
    _reachable_ws(monkeypatch, gluon_ws, gluon_common)
    dtype = torch.float16
    b, h, d_qk, d_v, topk = 3, 20, 192, 128, 70  # one head block: B first
    q, kv, idx = make(device, dtype, b, h, d_qk, topk, seed=6)
    ws = geometry("gluon_ws")
    with pytest.warns(UserWarning, match="did not compile"):
        with pytest.raises(ValueError, match="'gluon_ws' cannot run this call: did not compile"):
            splitkv_decode(q, kv, idx, d_qk**-0.5, d_v, config=ws, num_splits=1)
    assert len(broken.tries) == 1, broken.tries
    with pytest.raises(ValueError, match="'gluon_ws' cannot run this call: does not serve"):
        splitkv_decode(q, kv, idx, d_qk**-0.5, d_v, config=ws, num_splits=1)
    assert len(broken.tries) == 1, "the failed compile was retried"


@pytest.mark.parametrize("device", DEVICES)
def test_default_that_fails_to_compile_falls_to_the_next_rule(device, monkeypatch):
    """With no config, a default Gluon variant whose compile fails is skipped: the next
    matching rule of the defaults file runs (for H = 32 at B = 32 the Triton geometry with
    16-head tiles, not the Gluon tile on a Triton kernel), the numbers are right, and the
    record names what ran, the rule, and what was skipped and why."""
    from servelab.kernels.sparse_mla.dispatch.defaults import load
    from servelab.kernels.sparse_mla.dispatch.launch import splitkv_launch
    from servelab.kernels.sparse_mla.gluon_kernels import common as gluon_common
    from servelab.kernels.sparse_mla.gluon_kernels import ws as gluon_ws

    broken = BrokenKernel()
    monkeypatch.setattr(gluon_ws, "_sparse_mla_split_gluon_ws_kernel", broken, raising=False)
    monkeypatch.setattr(gluon_common, "FAILED", {})
    _reachable_ws(monkeypatch, gluon_ws, gluon_common)
    b, h, d_qk, d_v, topk = 32, 32, 192, 128, 40
    q, kv, idx = make(device, torch.float16, b, h, d_qk, topk, seed=9)
    out_ex, lse_ex, out_tol, lse_tol = bounds(q, kv, idx, d_qk**-0.5, d_v, torch.float16)
    rules = load().candidates(b, h, d_qk, None)
    assert [r.config.kernel for r in rules] == ["gluon_ws", "triton"], rules
    with pytest.warns(UserWarning, match="did not compile"):
        run = splitkv_launch(q, kv, idx, d_qk**-0.5, d_v)
    r = run.ran
    assert (r.variant, r.tile, r.rule) == ("triton", "16x32", rules[1].index), r
    assert r.skipped == (f"gluon_ws (rule {rules[0].index}): did not compile here",), r
    assert_close("default fallback out", run.out, out_ex, out_tol)
    assert_close("default fallback lse", run.lse, lse_ex, lse_tol)
    run = splitkv_launch(q, kv, idx, d_qk**-0.5, d_v)
    assert run.ran.variant == "triton" and "does not serve" in run.ran.skipped[0], run.ran
    assert len(broken.tries) == 1, "the failed compile was retried"


class _TooBig:
    """Stands in for a Triton split kernel: a launch with BLOCK_N = `block_n` raises as one
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
def test_geometry_that_does_not_fit(device, monkeypatch):
    """A default rule whose kernel needs more shared memory than the GPU has (Triton's
    OutOfResources) is skipped like a failed compile: at H = 16, B = 1 the register-prefetch
    rule, then the TP-slice rule runs. A named geometry that does not fit is a one-line error
    naming it. Simulated (no interpreter runs out of memory)."""
    from servelab.kernels.sparse_mla.dispatch.launch import splitkv_decode, splitkv_launch
    from servelab.kernels.sparse_mla.splitkv.geometry import SplitConfig
    from servelab.kernels.sparse_mla.triton_kernels import rp as triton_rp

    dtype = torch.float16
    b, h, d_qk, d_v, topk = 1, 12, 192, 128, 70
    q, kv, idx = make(device, dtype, b, h, d_qk, topk, seed=4)
    out_ex, lse_ex, out_tol, lse_tol = bounds(q, kv, idx, d_qk**-0.5, d_v, dtype)
    stand_in = _TooBig(triton_rp._sparse_mla_split_rp_kernel, 16)
    monkeypatch.setattr(triton_rp, "_sparse_mla_split_rp_kernel", stand_in)
    run = splitkv_launch(q, kv, idx, d_qk**-0.5, d_v)
    assert stand_in.tiles == [(16, 16)], stand_in.tiles
    r = run.ran
    assert (r.variant, r.tile) == ("triton", "16x32"), r
    assert any(x.startswith("triton_rp (rule") and "shared memory" in x for x in r.skipped), r
    assert_close("too-big fallback out", run.out, out_ex, out_tol)
    assert_close("too-big fallback lse", run.lse, lse_ex, lse_tol)
    with pytest.raises(ValueError, match=r"'triton_rp' cannot run this call: needs more shared"):
        splitkv_decode(q, kv, idx, d_qk**-0.5, d_v,
                       config=SplitConfig(16, 16, 4, 2, kernel="triton_rp"))  # fmt: skip


def test_named_variant_for_the_other_cache_raises():
    """A config naming a kernel that does not read this cache (gluon_ws with an FP8 cache, the
    FP8 per-chunk kernel with a 16-bit one) raises naming it; it is not run as another."""
    from servelab.kernels.sparse_mla.dispatch.defaults import geometry
    from servelab.kernels.sparse_mla.dispatch.launch import splitkv_decode
    from servelab.kernels.sparse_mla.fp8 import quantize_kv

    q, kv, idx = make("cpu", torch.float16, 2, 4, 48, 30, seed=1)
    cache = quantize_kv(kv, 32, 16)
    with pytest.raises(ValueError, match="'gluon_ws' cannot run this call: does not serve .*fp8"):
        splitkv_decode(q, cache, idx, 0.1, 32, config=geometry("gluon_ws"))
    with pytest.raises(ValueError, match="'triton_fp8_chunked' cannot run"):
        splitkv_decode(q, kv, idx, 0.1, 32, config=geometry("narrow_chunked"))


# The decisions the defaults file encodes (the H200's measured rules, docs/performance.md):
# (B, H, d_qk) -> the variant of the first rule with a 16-bit cache.
DECISIONS_16BIT = [
    (32, 64, 512, "gluon_ws"), (128, 128, 512, "gluon_ws"), (64, 32, 512, "gluon_ws"),
    (8, 64, 512, "gluon_ws"), (16, 64, 512, "gluon_ws"), (8, 32, 512, "gluon_ws"),
    (8, 20, 512, "gluon_ws"), (8, 128, 512, "gluon_ws"), (4, 128, 512, "gluon_ws"),
    (2, 128, 512, "gluon_ws"), (7, 64, 512, "triton"), (4, 64, 512, "triton"),
    (4, 32, 512, "triton"), (64, 16, 512, "gluon_nh"), (8, 16, 512, "gluon_nh"),
    (4, 16, 512, "gluon_nh"), (4, 8, 512, "gluon_nh"), (1, 64, 512, "triton"),
    (1, 16, 512, "triton_rp"), (2, 16, 512, "triton"), (1, 128, 512, "triton"),
    (1, 128, 576, "gluon_ws"), (2, 128, 576, "gluon_ws"), (1, 16, 576, "triton_rp"),
    (2, 16, 576, "gluon_nh"), (2, 8, 576, "gluon_nh"), (1, 64, 576, "triton"),
]  # fmt: skip


def test_default_decisions_with_a_16_bit_cache():
    """The first rule at each cell above, its partials (16-bit for gluon_ws), and without
    Gluon (another GPU) a Triton rule; one rule always matches last."""
    from servelab.kernels.sparse_mla.dispatch.defaults import default_config, load

    for b, h, d_qk, want in DECISIONS_16BIT:
        cfg = default_config(b, h, d_qk)
        assert cfg.kernel == want, (b, h, d_qk, cfg)
        assert cfg.partial_dtype == ("input" if want == "gluon_ws" else "fp32"), (b, h, cfg)
        assert default_config(b, h, d_qk, gluon=False).kernel in ("triton", "triton_rp")
        assert load().candidates(b, h, d_qk, None)[-1].config.kernel == "triton"


def _anchors(page) -> set[str]:
    """The heading anchors of a markdown page, as GitHub makes them."""
    import re

    text = page.read_text()
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.*)$", text, re.M)}  # fmt: skip


def test_defaults_file_rests_on_measurements():
    """Every rule of every defaults file names a geometry whose variant exists and reads the
    rule's cache, and rests on a measurement where its choice was the faster (after_us <
    before_us), dated, with the benchmark that took it (a file in benchmarks/) and the lab
    notebook section that writes it up (a heading of a page in docs/notes/)."""
    import re
    from pathlib import Path

    from servelab.kernels.sparse_mla.dispatch.defaults import HERE, parse
    from servelab.kernels.sparse_mla.dispatch.variants import VARIANTS

    repo = Path(__file__).resolve().parents[4]
    files = sorted(HERE.glob("*.toml"))
    assert files
    for f in files:
        d = parse(f)
        for r in d.rules:
            v = VARIANTS[r.config.kernel]
            assert r.cache is None or r.cache in v.caches, (f.name, r.index, v)
            m = r.measured
            assert m.after_us < m.before_us, (f.name, r.index, m)
            assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", m.date), m
            assert (repo / m.command.split()[0]).is_file(), m.command
            page, anchor = m.note.split("#")
            assert anchor in _anchors(repo / page), m.note
        last = d.rules[-1]
        assert (last.cache, last.heads, last.batch, last.d_qk) == (None,) * 4, last
        assert last.config.kernel == "triton"


def test_gluon_can_be_switched_off_for_an_ab(monkeypatch):
    """SERVELAB_SPARSE_MLA_GLUON=0 makes a Hopper machine refuse the Gluon variants (the
    dispatch then takes the Triton rules), so the engine's splitkv backend can be A/B-ed
    with and without them."""
    from servelab.kernels.sparse_mla.gluon_kernels import common as gluon_common

    monkeypatch.setattr(gluon_common, "AVAILABLE", True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(gluon_common, "_is_hopper", lambda index: True)
    monkeypatch.delenv("SERVELAB_SPARSE_MLA_GLUON", raising=False)
    assert gluon_common.gluon_device()
    monkeypatch.setenv("SERVELAB_SPARSE_MLA_GLUON", "0")
    assert not gluon_common.gluon_device()
