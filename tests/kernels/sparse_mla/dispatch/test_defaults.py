"""The defaults file (dispatch/defaults.py, defaults/h200.toml) picks what the H200 measured
faster: the merge (plain kernel or PDL) and the FP8 kernel."""

from __future__ import annotations

from dataclasses import replace

# H200, 2026-11-29, `bench_sparse_mla.py --compare` (us per call, two kernels vs PDL):
# (H, topk, B) -> (kernel_us, pdl_us). The default merge must pick the faster one, or one
# within 0.5% of it.
MEASURED_MERGE = {
    (64, 640, 1): (8.46, 8.08), (64, 640, 2): (10.19, 9.73), (64, 640, 4): (11.83, 11.25),
    (64, 640, 8): (15.11, 15.20), (32, 640, 1): (8.07, 7.41), (32, 640, 2): (8.33, 7.99),
    (32, 640, 4): (10.28, 9.75), (32, 640, 8): (12.72, 12.10), (16, 2048, 1): (10.05, 9.37),
    (16, 2048, 2): (11.19, 11.04), (16, 2048, 4): (13.66, 14.17), (16, 2048, 8): (17.69, 18.18),
    (128, 2048, 1): (14.90, 15.48), (128, 2048, 2): (18.94, 19.10),
    (128, 2048, 4): (29.21, 29.33), (128, 2048, 8): (33.67, 33.58),
    (128, 1152, 1): (12.39, 11.81), (128, 1152, 2): (14.18, 13.59),
    (128, 1152, 4): (19.69, 20.04), (128, 1152, 8): (25.80, 24.79),
}  # fmt: skip


# Same run, FP8: (H, scale tile, B) -> (reshape kernel us, per-chunk kernel us).
MEASURED_FP8 = {
    (64, 64, 1): (11.03, 13.41), (64, 64, 2): (16.80, 14.33), (64, 64, 4): (24.76, 19.70),
    (64, 64, 8): (33.55, 27.12), (64, 64, 16): (26.73, 38.43), (64, 64, 128): (82.15, 147.87),
    (32, 64, 16): (34.16, 28.04), (32, 64, 128): (155.91, 146.29),
    (16, 128, 16): (28.71, 31.30), (16, 128, 128): (168.48, 192.16),
}  # fmt: skip


def test_default_merge_picks_the_measured_faster():
    """The defaults file's `[merge]` rule, applied to the Triton defaults the timings were
    taken with, picks PDL or the plain merge kernel as measured (or within 0.5%)."""
    from servelab.kernels.sparse_mla.dispatch.defaults import default_config, load
    from servelab.kernels.sparse_mla.splitkv.geometry import choose_num_splits as choose
    from servelab.kernels.sparse_mla.splitkv.geometry import resolve_merge

    policy = load().merge
    for (h, topk, b), (k_us, p_us) in MEASURED_MERGE.items():
        d_qk = 576 if topk == 2048 else 512
        cfg = default_config(b, h, d_qk, gluon=False)  # the table's kernels
        s = choose(b, h, topk, cfg, 132)
        got = resolve_merge(cfg, b, h, s, 132, policy, pdl_ok=True)
        chosen, other = (p_us, k_us) if got == "pdl" else (k_us, p_us)
        assert got in ("pdl", "kernel") and chosen <= other * 1.005, (h, topk, b, got)
    # Forced choices are kept; one split needs no merge; no PDL without the hardware.
    cfg = default_config(1, 64, 512)
    for m in ("kernel", "pdl"):
        assert resolve_merge(replace(cfg, merge=m), 1, 64, 20, 132, policy, True) == m
    assert resolve_merge(cfg, 1, 64, 1, 132, policy, True) == "single"
    assert resolve_merge(replace(cfg, merge="pdl"), 1, 64, 20, 132, policy, False) == "kernel"


def test_default_fp8_kernel_is_the_measured_faster():
    from servelab.kernels.sparse_mla.dispatch.defaults import default_config

    for (h, tile, b), (old_us, new_us) in MEASURED_FP8.items():
        d_qk = 576 if tile == 128 else 512
        kernel = default_config(b, h, d_qk, fp8_tile=tile, gluon=False).kernel
        assert kernel in ("triton", "triton_fp8_chunked"), (h, tile, b, kernel)
        assert (kernel == "triton_fp8_chunked") == (new_us < old_us), (h, tile, b)
