"""The report's plots (matplotlib, Agg backend) as PNG bytes: throughput vs load with CI bars,
latency distributions, acceptance length, and effect ratios with CIs."""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence

from servelab.experiment.design.metrics import METRICS
from servelab.experiment.stats.analysis import Analysis

CLIP_PCT = 1000.0  # the forest plot's right edge at most (+1000% = 11x): beyond it, arrows


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    _plt().close(fig)
    return buf.getvalue()


def throughput(an: Analysis, metric: str = "output_throughput_tok_s") -> bytes:
    """Median per arm at each load point, with the bootstrap 95% CI of the median as error bars."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    xs = list(range(len(an.load_keys)))
    for i, arm in enumerate(an.arms):
        med, lo, hi = [], [], []
        for lk in an.load_keys:
            s = an.spreads[(arm, lk, metric)]
            med.append(s.median)
            lo.append(s.median - (s.ci_low if math.isfinite(s.ci_low) else s.median))
            hi.append((s.ci_high if math.isfinite(s.ci_high) else s.median) - s.median)
        off = (i - (len(an.arms) - 1) / 2) * 0.06
        bars = ax.errorbar(
            [x + off for x in xs], med, yerr=[lo, hi], marker="o", capsize=4, label=arm
        )
        for x, lk in zip(xs, an.load_keys, strict=True):  # every run, so the spread is visible
            vals = an.spreads[(arm, lk, metric)].values
            ax.scatter(
                [x + off + 0.03] * len(vals), vals, s=9, alpha=0.5, color=bars[0].get_color()
            )
    ax.set_xticks(xs, an.load_keys)
    ax.set_xlabel("load point")
    ax.set_ylabel(f"{METRICS[metric].label} ({METRICS[metric].unit})")
    ax.set_title(f"{METRICS[metric].label} per arm (median, 95% CI, dots: runs)")
    ax.grid(alpha=0.3)
    ax.legend()
    return _png(fig)


def distributions(
    values: Mapping[tuple[str, str], Sequence[float]],
    arms: Sequence[str],
    load_keys: Sequence[str],
    label: str,
) -> bytes:
    """Box plots of per-request values (all runs pooled) per load point, arms side by side."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    width = 0.8 / max(1, len(arms))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, arm in enumerate(arms):
        data = [list(values.get((arm, lk), [])) or [math.nan] for lk in load_keys]
        pos = [j + (i - (len(arms) - 1) / 2) * width for j in range(len(load_keys))]
        bp = ax.boxplot(
            data, positions=pos, widths=width * 0.9, patch_artist=True, showfliers=False
        )
        for box in bp["boxes"]:
            box.set_facecolor(colors[i % len(colors)])
            box.set_alpha(0.6)
        ax.plot([], [], color=colors[i % len(colors)], linewidth=8, alpha=0.6, label=arm)
    ax.set_xticks(range(len(load_keys)), load_keys)
    ax.set_ylabel(label)
    ax.set_title(f"{label}: per-request distribution (all runs)")
    ax.grid(alpha=0.3, axis="y")
    ax.legend()
    return _png(fig)


def acceptance(an: Analysis) -> bytes | None:
    """Median acceptance length per arm and load point; None when no arm reports one."""
    rows = {
        arm: [an.spreads[(arm, lk, "accept_length")].median for lk in an.load_keys]
        for arm in an.arms
    }
    rows = {a: v for a, v in rows.items() if any(math.isfinite(x) for x in v)}
    if not rows:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    width = 0.8 / len(rows)
    for i, (arm, vals) in enumerate(rows.items()):
        ax.bar([j + i * width for j in range(len(an.load_keys))], vals, width=width, label=arm)
    ax.set_xticks([j + width * (len(rows) - 1) / 2 for j in range(len(an.load_keys))], an.load_keys)
    ax.set_ylabel("tokens per verify step")
    ax.set_title("acceptance length (median over runs)")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.legend()
    return _png(fig)


def effects(an: Analysis, metrics: Sequence[str]) -> bytes:
    """Forest plot: change vs baseline in % with 95% CI; the noise band shaded."""
    plt = _plt()
    from matplotlib.ticker import NullLocator

    items = [e for (arm, lk, m), e in an.effects.items() if m in metrics and math.isfinite(e.ratio)]
    fig, ax = plt.subplots(figsize=(6.4, 0.5 + 0.32 * max(1, len(items))))
    band = an.noise_band * 100
    ax.axvspan(-band, band, color="grey", alpha=0.2, label=f"noise band +-{band:g}%")
    ax.axvline(0, color="black", linewidth=0.8)
    color = {"better": "tab:green", "worse": "tab:red"}
    for y, e in enumerate(items):
        lo = e.pct(e.ci_low) if math.isfinite(e.ci_low) else e.pct()
        hi = e.pct(e.ci_high) if math.isfinite(e.ci_high) else e.pct()
        ax.errorbar(
            [e.pct()],
            [y],
            xerr=[[e.pct() - lo], [hi - e.pct()]],
            fmt="o",
            capsize=3,
            color=color.get(e.verdict, "tab:blue"),
        )
    ax.set_yticks(
        range(len(items)), [f"{e.arm} {e.load_key} {METRICS[e.metric].label}" for e in items]
    )
    ax.invert_yaxis()
    # linear within a few noise bands, logarithmic beyond, and clipped at +1000%: a +265% (or
    # +100000%) CI no longer squeezes the band and every effect near it into a sliver
    lin = max(5 * band, 5.0)
    ends = [x for e in items for x in (e.pct(e.ci_low), e.pct(e.ci_high)) if math.isfinite(x)]
    right = min(CLIP_PCT, max([lin * 2, *ends]) * 1.3)
    left = max(-100.0, min([-lin * 2, *ends]) * 1.3)
    ax.set_xscale("symlog", linthresh=lin, linscale=1.5)
    ax.set_xlim(left, right)
    ticks = [t for t in (-100, -lin, -band, 0, band, lin, 100, 1000) if left <= t <= right]
    ax.set_xticks(ticks, [f"{t:+g}%" if t else "0" for t in ticks], fontsize=8)
    ax.xaxis.set_minor_locator(NullLocator())
    for y, e in enumerate(items):  # a CI beyond the clip: an arrow at the edge, its end in text
        hi = e.pct(e.ci_high)
        if math.isfinite(hi) and hi > right or not math.isfinite(hi):
            ax.annotate(f"to {hi:+.0f}%" if math.isfinite(hi) else "open", (right, y),
                        xytext=(-4, 5), textcoords="offset points", ha="right", fontsize=7)
            ax.plot([right], [y], marker=">", color="black", markersize=5, clip_on=False)
    ax.set_xlabel(f"change vs baseline (%), 95% CI; linear within +-{lin:g}%, log beyond")
    ax.set_title("effects (green: better, red: worse, blue: within noise)")
    ax.legend(loc="lower right", fontsize=8)
    return _png(fig)
