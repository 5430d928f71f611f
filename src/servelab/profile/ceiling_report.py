"""`servelab ceiling`: the roofline bound as a JSON-ready dict and a printed table."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from servelab.console import make_console
from servelab.errors import UserError
from servelab.profile.presets import load_gpu, load_model
from servelab.profile.roofline import DTYPE_BYTES, ceiling, resolve_dtypes


def ceiling_report(
    model: str,
    gpu: str,
    batches: list[int],
    context: int = 4096,
    tp: int = 1,
    weight_dtype: str | None = None,
    expert_dtype: str | None = None,
    kv_dtype: str = "bf16",
    mtp_accept: float | None = None,
    mtp_draft: int = 1,
    measured_tok_s: float | None = None,
    measured_peaks: bool = False,
    allreduce_latency_us: float = 0.0,
) -> dict[str, Any]:
    """Bounds per batch size (with MTP if `mtp_accept`), and efficiency against `measured_tok_s`."""
    m, msrc = load_model(model)
    g, gsrc = load_gpu(gpu, measured_peaks)
    if measured_tok_s is not None and not measured_tok_s > 0:
        raise UserError(f"--measured must be a positive tokens/s, got {measured_tok_s}")
    wdt, edt = resolve_dtypes(m, weight_dtype, expert_dtype)
    # the same machine and load for the MTP bound and its plain baseline, passed by name once
    shared = dict(context=context, tp=tp, weight_dtype=weight_dtype, expert_dtype=expert_dtype,
                  kv_dtype=kv_dtype, allreduce_latency_us=allreduce_latency_us)
    rows = ceiling(m, g, batches, mtp_accept=mtp_accept, mtp_draft=mtp_draft, **shared)
    base = ceiling(m, g, batches, **shared) if mtp_accept is not None else None
    out_rows = []
    for k, r in enumerate(rows):
        d = asdict(r)
        if base is not None:
            d["mtp_speedup"] = r.tok_s / base[k].tok_s
        if measured_tok_s is not None:
            d["measured_tok_s"] = measured_tok_s
            d["efficiency"] = measured_tok_s / r.tok_s
        out_rows.append(d)
    total_bytes = rows[0].weight_bytes if rows else None
    warnings = []
    weights_per_gpu = None
    if rows:
        dense = m.total_params - m.n_moe_layers * m.n_experts * m.expert_params
        stored = dense * DTYPE_BYTES[wdt] + m.n_moe_layers * m.n_experts * m.expert_params * DTYPE_BYTES[edt]
        weights_per_gpu = stored / tp
        if g.memory_bytes and weights_per_gpu > g.memory_bytes:
            warnings.append(
                f"weights need {weights_per_gpu / 1e9:.0f} GB per GPU at --tp {tp}, more than "
                f"{g.name}'s {g.memory_bytes / 1e9:.0f} GB: raise --tp or lower --weight-dtype"
            )
    return {
        "model": m.name,
        "gpu": g.name,
        "tp": tp,
        "context": context,
        "kv_dtype": kv_dtype,
        "weight_dtype": wdt,
        "expert_dtype": edt if m.n_experts else None,  # what the bound used; None: no experts
        "mtp": {"accept": mtp_accept, "draft": mtp_draft} if mtp_accept is not None else None,
        "allreduce_latency_us": allreduce_latency_us,
        "total_params": m.total_params,
        "active_params": m.active_params,
        "weights_bytes_per_gpu": weights_per_gpu,
        "step_weight_bytes_first_batch": total_bytes,
        "gpu_numbers": {"hbm_bytes_s": g.hbm_bytes_s, "link_bytes_s": g.link_bytes_s,
                        "flops": g.flops},
        "sources": {"model": msrc, "gpu": gsrc},
        "bounds": out_rows,
        "tok_s": {str(r["batch"]): r["tok_s"] for r in out_rows},
        "warnings": warnings,
        "assumptions": [
            "uniform expert routing; k of E experts per token",
            "weights read once per step; KV read once per request per layer (MLA: every TP rank)",
            "launch latency ignored; all-reduce latency only as given: an upper bound",
        ],
    }


def print_ceiling(doc: dict[str, Any]) -> None:
    """Print the bounds as a table, warnings first."""
    from rich.table import Table

    con = make_console()
    for w in doc["warnings"]:
        con.print(f"warning: {w}", style="yellow")
    mtp = doc["mtp"]
    title = (
        f"{doc['model']} on {doc['tp']} x {doc['gpu']}, context {doc['context']}, "
        f"weights {doc['weight_dtype']}"
        + (f"/experts {doc['expert_dtype']}" if doc["expert_dtype"] else "")
        + f", KV {doc['kv_dtype']}"
        + (f", MTP tau={mtp['accept']} draft={mtp['draft']}" if mtp else "")
    )
    con.print(
        f"{doc['total_params'] / 1e9:.1f}B parameters, {doc['active_params'] / 1e9:.2f}B active per token"
    )
    t = Table(title=title)
    cols = ["B", "tok/s", "/req", "step us", "mem us", "comp us", "comm us", "bound", "experts"]
    if mtp:
        cols += ["draft us", "MTP x"]
    if any("efficiency" in r for r in doc["bounds"]):
        cols += ["measured", "eff"]
    for c in cols:
        t.add_column(c, justify="right", no_wrap=True)
    for r in doc["bounds"]:
        row = [str(r["batch"]), f"{r['tok_s']:,.0f}", f"{r['tok_s_per_request']:,.1f}",
               f"{r['step_us']:,.0f}", f"{r['memory_us']:,.0f}", f"{r['compute_us']:,.0f}",
               f"{r['comm_us']:,.1f}", r["bound"][:3], f"{r['distinct_experts']:.1f}"]
        if mtp:
            row += [f"{r['draft_us']:,.0f}", f"{r['mtp_speedup']:.2f}"]
        if "efficiency" in r:
            row += [f"{r['measured_tok_s']:,.1f}", f"{100 * r['efficiency']:.1f}%"]
        t.add_row(*row)
    con.print(t)
    for n in sorted({n for r in doc["bounds"] for n in r["notes"]}):
        con.print(f"note: {n}", style="dim")
    con.print(f"model: {doc['sources']['model']['source']}", style="dim")
    con.print(f"gpu: {doc['sources']['gpu']['source']}", style="dim")
