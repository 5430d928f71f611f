"""docs/performance.md's generated tables, from the benchmarks' result files (and the check that
the page still says what those files say).

A generated table sits between two markers in the page:

    <!-- generated: sparse-mla-main docs/results/<file>.jsonl -->
    ...
    <!-- end generated -->

`render(kind, source)` builds it: "sparse-mla-main" (the main table of bench_sparse_mla.py's
JSONL), "sparse-mla-goals" (the issue goals against the same JSONL), "sparse-mla-rules" (which
kernel runs where: the defaults file). `check` regenerates every block of the page and names
the ones that differ; `write` rewrites them in place.

    PYTHONPATH=src python3 benchmarks/perf_tables.py check docs/performance.md
    PYTHONPATH=src python3 benchmarks/perf_tables.py write docs/performance.md
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(<!-- generated: (\S+) (\S+) -->\n)(.*?)(<!-- end generated -->)", re.S)
SHAPES = {"v3.2": "V3.2", "v4-flash": "V4-Flash", "v4-pro": "V4-Pro",
          "v3.2-tp8-h16": "H16 (V3.2 TP8)", "v4-flash-tp2-h32": "H32 (V4-Flash TP2)"}  # fmt: skip
NAN = float("nan")


def _cells(path: Path) -> dict[tuple[str, int, str], dict]:
    """(shape, B, variant) -> the timed record of a bench_sparse_mla.py JSONL."""
    out = {}
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        if "us" in rec and "variant" in rec:
            out[(rec["shape"], rec["B"], rec["variant"])] = rec
    return out


def _header(path: Path) -> str:
    """Device and date from the JSONL's log twin (bench_sparse_mla.log's first line)."""
    log = path.with_suffix(".log")
    return log.read_text().splitlines()[0] if log.exists() else ""


def _main_table(path: Path) -> str:
    cells = _cells(path)
    rows = ["| shape | B | bf16 us | kernel (splits) | % floor | x naive | x eager | FP8 us | "
            "FP8 kernel | FP8 % floor | FP8 x bf16 |", "|---|---:|---:|---|---:|---:|---:|---:|"
            "---|---:|---:|"]  # fmt: skip
    for shape, label in SHAPES.items():
        for b in sorted({k[1] for k in cells if k[0] == shape}):
            s, f = cells.get((shape, b, "splitkv"), {}), cells.get((shape, b, "fp8"), {})
            n, e = cells.get((shape, b, "naive"), {}), cells.get((shape, b, "eager"), {})
            su, fu = s.get("us", NAN), f.get("us", NAN)
            rows.append(
                f"| {label} | {b} | {su:.2f} | {s.get('ran')} ({s.get('num_splits')}) | "
                f"{s.get('pct_floor', NAN):.1f} | {n.get('us', NAN) / su:.1f} | "
                f"{e.get('us', NAN) / su:.1f} | {fu:.2f} | {f.get('ran')} | "
                f"{f.get('pct_floor', NAN):.1f} | {su / fu:.2f} |")  # fmt: skip
    return "\n".join(rows) + "\n"


def _goals_table(path: Path) -> str:
    cells = _cells(path)

    def us(shape, b, v):
        return cells[(shape, b, v)]["us"]

    b1 = {label: us(shape, 1, "splitkv") for shape, label in SHAPES.items()}
    floor = {(shape, b): cells[(shape, b, "splitkv")]["pct_floor"]
             for shape in SHAPES for b in (32, 64, 128)}  # fmt: skip
    met = [f"{SHAPES[s]} B={b}" for (s, b), v in floor.items() if v >= 60]
    eager = {(s, b): us(s, b, "eager") / us(s, b, "splitkv") for s in SHAPES
             for b in sorted({k[1] for k in cells if k[0] == s})}  # fmt: skip
    low = sorted((v, f"{SHAPES[s]} B={b}") for (s, b), v in eager.items() if v < 20)
    fp8 = [us(s, b, "splitkv") / us(s, b, "fp8") for s in SHAPES
           for b in sorted({k[1] for k in cells if k[0] == s})]  # fmt: skip
    naive = us("v4-flash", 1, "naive") / us("v4-flash", 1, "splitkv")
    rows = ["| claim | number | goal | status |", "|---|---|---|---|",
            f"| split-KV vs the (B, H) fallback, V4-Flash B = 1 | {naive:.1f}x "
            f"({us('v4-flash', 1, 'naive'):.1f} -> {us('v4-flash', 1, 'splitkv'):.2f} us) | "
            f">= 5x | {'met' if naive >= 5 else 'missed'} |",
            "| B = 1 latency per call | " + ", ".join(f"{k} {v:.2f}" for k, v in b1.items())
            + " us | <= 8 us | " + ("met at " + ", ".join(k for k, v in b1.items() if v <= 8)
                                    + "; missed at 128 heads") + " |",
            f"| % of the roofline floor at B >= 32 | {min(floor.values()):.1f}-"
            f"{max(floor.values()):.1f}% | >= 60% | met at {len(met)} of {len(floor)} cells "
            f"({', '.join(met)}) |",
            f"| vs torch eager, every B | {min(eager.values()):.1f}-{max(eager.values()):.1f}x | "
            f">= 20x | missed at {len(low)} of {len(eager)} cells ("
            + ", ".join(f"{n} {v:.1f}x" for v, n in low) + ") |",
            f"| FP8 KV vs bf16 (the FP8 default against the bf16 default) | "
            f"{min(fp8):.2f}-{max(fp8):.2f}x | >= 1.5x | missed |"]  # fmt: skip
    return "\n".join(rows) + "\n"


def _rules_table(path: Path) -> str:
    sys.path.insert(0, str(REPO / "src"))
    from servelab.kernels.sparse_mla.dispatch.defaults import parse

    d = parse(path)
    rows = ["| rule | cache | heads | batch | other | variant (geometry) | rests on (after / before us) |",
            "|---:|---|---|---|---|---|---|"]  # fmt: skip

    def rng(r):
        if r is None:
            return "any"
        return f"{r[0]}+" if r[1] >= 1000000 else f"{r[0]}-{r[1]}" if r[0] != r[1] else str(r[0])

    for r in d.rules:
        other = ", ".join(x for x in (f"d_qk {r.d_qk}" if r.d_qk else "",
                                      f"B x H >= {r.batch_x_heads_min}" if r.batch_x_heads_min else "",
                                      f"scale tile {rng(r.fp8_tile)}" if r.fp8_tile else "") if x)  # fmt: skip
        m = r.measured
        rows.append(f"| {r.index} | {r.cache or 'any'} | {rng(r.heads)} | {rng(r.batch)} | "
                    f"{other or '-'} | {r.config.kernel} ({r.geometry_name}) | {m.cell}: "
                    f"{m.after_us} / {m.before_us} ({m.date}) |")  # fmt: skip
    return "\n".join(rows) + "\n"


RENDER = {"sparse-mla-main": _main_table, "sparse-mla-goals": _goals_table,
          "sparse-mla-rules": _rules_table}  # fmt: skip


def render(kind: str, source: str) -> str:
    if kind not in RENDER:
        raise SystemExit(f"unknown generated table {kind!r}; known: {', '.join(RENDER)}")
    return RENDER[kind](REPO / source)


def stale_blocks(page: Path) -> list[str]:
    """The generated blocks of `page` whose text differs from a fresh render."""
    return [f"{m.group(2)} {m.group(3)}" for m in BLOCK.finditer(page.read_text())
            if m.group(4) != render(m.group(2), m.group(3))]  # fmt: skip


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("check", "write"):
        raise SystemExit(__doc__)
    page = Path(argv[1])
    if argv[0] == "write":
        text = BLOCK.sub(lambda m: m.group(1) + render(m.group(2), m.group(3)) + m.group(5),
                         page.read_text())  # fmt: skip
        page.write_text(text)
        return 0
    stale = stale_blocks(page)
    for s in stale:
        print(f"{page}: generated table {s} differs from its source; run perf_tables.py write")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
