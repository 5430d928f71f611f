"""docs/performance.md's generated tables say what their result files say: each block between
its markers equals a fresh render from the file it names (benchmarks/perf_tables.py), so a
number in the page cannot drift from its measurement; and the page stays a short reference."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]


def _perf_tables():
    sys.path.insert(0, str(REPO / "benchmarks"))
    import perf_tables

    return perf_tables


def test_generated_tables_match_their_result_files():
    pt = _perf_tables()
    page = REPO / "docs" / "performance.md"
    blocks = [m.group(2) for m in pt.BLOCK.finditer(page.read_text())]
    assert {"sparse-mla-main", "sparse-mla-goals", "sparse-mla-rules"} <= set(blocks), blocks
    assert pt.stale_blocks(page) == []


def test_a_changed_number_is_caught(tmp_path):
    """The check is not vacuous: one digit changed in a generated table is reported."""
    pt = _perf_tables()
    text = (REPO / "docs" / "performance.md").read_text()
    m = next(m for m in pt.BLOCK.finditer(text) if m.group(2) == "sparse-mla-main")
    body = m.group(4).replace("| V4-Flash | 1 | ", "| V4-Flash | 1 | 1", 1)
    page = tmp_path / "performance.md"
    page.write_text(text[: m.start(4)] + body + text[m.end(4):])
    assert pt.stale_blocks(page) == [f"sparse-mla-main {m.group(3)}"]


def test_the_page_is_a_short_reference():
    assert len((REPO / "docs" / "performance.md").read_text().splitlines()) < 400
