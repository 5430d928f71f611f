"""What `servelab bench` prints and writes: each load point's table (one line in a sweep) and
warnings, the sweep's table, the store rows, the --output JSON document and, with
--save-result, each point's file in vLLM's layout (bench/importers/vllm_layout.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
from rich.table import Table

from servelab import atomic, provenance
from servelab.bench.config import BenchConfig
from servelab.bench.importers import vllm_layout
from servelab.bench.report import summary_table
from servelab.bench.run import save_load_point
from servelab.errors import UserError
from servelab.store import Store


@dataclass(eq=False)
class Recorder:
    """The load points measured so far: each stored and printed as it completes, and the
    --output document rewritten after every point, so a crash keeps what was measured."""

    cfg: BenchConfig
    output: str | None
    store: Store | None
    console: Any
    label: str | None
    out: list[dict] = field(default_factory=list)  # every point's summary, with its store id
    sweep_doc: dict[str, Any] | None = None
    server_info: dict[str, Any] = field(default_factory=dict)
    vllm: vllm_layout.VllmResultConfig | None = None
    vllm_files: list[str] = field(default_factory=list)

    def provenance(self) -> dict[str, Any]:
        return provenance.collect(server_info=self.server_info,
                                  workload_seed=self.cfg.workload.seed)

    def write_output(self) -> None:
        """Rewrite --output (if given) with every point so far (and the sweep)."""
        if not self.output:
            return
        doc: dict[str, Any] = {"provenance": self.provenance(), "load_points": self.out}
        if self.sweep_doc is not None:
            doc["sweep"] = self.sweep_doc
        try:
            atomic.write_bytes(self.output, orjson.dumps(doc, option=orjson.OPT_INDENT_2
                                                         | orjson.OPT_SERIALIZE_NUMPY))
        except OSError as exc:
            raise UserError(f"--output {self.output}: cannot write ({exc.strerror or exc})"
                            + ("; the load points are in the store" if self.store else "")
                            ) from None

    def keep(self, lp: Any, res: Any, line: Any = None) -> int | None:
        """Store and print one load point (a table; `line(store_id)` in a sweep); the
        caller rewrites --output once the point is complete."""
        self.server_info = res.server_info
        st, cfg = self.store, self.cfg
        row = save_load_point(st, cfg, lp, res, label=self.label) if st is not None else None
        if line is None:
            report_point(self.console, res, f"{lp.key}  ({cfg.shown_url}, {cfg.api})"
                         + (f"  stored as #{row}" if row else ""), full=True)
        else:
            report_point(self.console, res, line(row), full=False)
        self.out.append({**res.summary, "store_id": row})
        if self.vllm is not None:  # as it completes: a crash keeps the points measured
            doc = vllm_layout.result_document(
                res.summary, res.records, cfg=self.vllm, api=cfg.api,
                tokenizer=cfg.workload.tokenizer, label=self.label, burstiness=lp.burstiness)
            path = vllm_layout.write(self.vllm, doc)
            self.vllm_files.append(str(path))
            self.console.print(f"vLLM result: {path}", markup=False, highlight=False)
        return row


def report_point(console: Any, res: Any, title: str, full: bool) -> None:
    """The load point's table (or one line in a sweep) and its warnings."""
    s = res.summary
    if full:
        console.print(summary_table(s, title=title))
    else:
        console.print(title, markup=False, highlight=False)
    if s.get("above_saturation"):  # named: its latencies are a transient, not a rate's
        console.print(f"warning: load point {s.get('load_key')} is ABOVE SATURATION: "
                      f"{(s.get('steadiness') or {}).get('reason')}; the server completes "
                      "fewer requests than arrive, so its latencies grow with the run's length",
                      style="yellow")
    util = s.get("client_cpu_util")
    # under ~1 s (e.g. every request refused at once) start-up CPU dominates the ratio
    if util is not None and util > 0.8 and s["duration_s"] >= 1.0:
        console.print(f"warning: the client used {util:.0%} of a core during this "
                      "load point: it may limit what was measured (see docs/METRICS.md)",
                      style="yellow")
    lag = s.get("dispatch_lag_ms")
    if s.get("dispatch_behind") and isinstance(lag, dict):
        console.print(f"warning: the client fell behind the arrival schedule ({lag['late']} of "
                      f"{s['issued']} requests sent over 10 ms late; dispatch lag p99 "
                      f"{lag['p99']:.1f} ms, max {lag['max']:.1f} ms, growth "
                      f"{lag['growth']:.1f} ms): the load sent was gentler than asked "
                      "(see docs/METRICS.md)", style="yellow")
    mism = s.get("output_len_mismatch")
    if mism:  # e.g. a server that ignores ignore_eos/min_tokens
        by_chunks = "chunks" in (s.get("output_tokens_source") or {})
        why = ("counted one token per chunk: the server sent no usage; --tokenizer "
               "counts the text") if by_chunks else "does the server honour ignore_eos / min_tokens?"
        console.print(f"warning: {mism} of {s['completed']} completed "
                      f"requests returned another output length than asked ({why})",
                      style="yellow")
    if s["issued"] == 0:
        console.print("no request was sent: --max-duration ended the load point "
                      "before the first one", style="red")
    elif s["completed"] == 0:
        reasons = ", ".join(f"{k} x{v}" for k, v in s["failure_reasons"].items())
        console.print(f"every request failed ({reasons})", style="red")
    # one example per reason: 'http_400 x100' alone does not say the model name was wrong
    seen: set[str] = set()
    for rec in res.records:
        if rec["error"] and rec["error"] not in seen:
            seen.add(rec["error"])
            console.print(f"  {rec['error']}: {rec['error_detail'] or ''}"[:300],
                          markup=False, highlight=False)


def _ms(stat: Any, key: str) -> str:
    v = stat.get(key) if isinstance(stat, dict) else None
    return "-" if v is None else f"{v:,.1f}"


def point_line(p: Any, store_id: int | None) -> str:
    """One line per sweep point: role, load, achieved rate, the usual SLO latencies, verdict."""
    s = p.summary
    rate = s.get("request_throughput_req_s")
    verdict = "" if p.check is None else ("  SLO met" if p.check.met else
                                          "  SLO missed: " + "; ".join(p.check.reasons))
    st = (s.get("steadiness") or {}).get("status")
    jpt = s.get("j_per_output_token")
    return (f"{p.role:<11} {p.load.key:<12} {'-' if rate is None else f'{rate:.3f}':>8} req/s  "
            f"TTFT p99 {_ms(s.get('ttft_ms'), 'p99')} ms  TPOT p99 {_ms(s.get('tpot_ms'), 'p99')}"
            f" ms  E2E p99 {_ms(s.get('e2e_ms'), 'p99')} ms  failed {s.get('failed')}"
            + (f"  {st}" if st else "") + (f"  {jpt:.3g} J/tok" if jpt is not None else "")
            + (f"  #{store_id}" if store_id else "") + verdict)


def sweep_table(result: Any, slo: Any) -> Any:
    """The sweep's points ordered by load, and the capacity."""
    title = "capacity sweep" + (f" under {slo.describe()}" if slo else "")
    t = Table(title=title, title_justify="left")
    for c in ("role", "load", "req/s", "out tok/s", "TTFT p50", "TTFT p99", "TPOT p50",
              "TPOT p99", "E2E p99", "failed", "steadiness", "SLO"):
        t.add_column(c, justify="left" if c in ("role", "load", "steadiness", "SLO") else "right")

    def order(p: Any) -> float:
        return 0.0 if p.load.concurrency else p.load.request_rate

    for p in sorted(result.points, key=order):
        s = p.summary
        rate, tok = s.get("request_throughput_req_s"), s.get("output_throughput_tok_s")
        verdict = "" if p.check is None else ("met" if p.check.met else "missed")
        t.add_row(p.role, p.load.key, "-" if rate is None else f"{rate:.3f}",
                  "-" if tok is None else f"{tok:,.1f}",
                  _ms(s.get("ttft_ms"), "median"), _ms(s.get("ttft_ms"), "p99"),
                  _ms(s.get("tpot_ms"), "median"), _ms(s.get("tpot_ms"), "p99"),
                  _ms(s.get("e2e_ms"), "p99"), str(s.get("failed")),
                  (s.get("steadiness") or {}).get("status") or "-", verdict)
    return t
