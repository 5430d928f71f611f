"""GuideLLM 0.8.1's own benchmarks.json (data/README.md says how it was made) imports with the
TTFT / TPOT its console printed, within the console's rounding."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest
from cli_inproc import cli

from servelab.bench.importers import import_file
from servelab.errors import UserError
from servelab.store import Store

DATA = Path(__file__).parent / "data"


def _unzip(tmp: Path, name: str, as_name: str) -> Path:
    p = tmp / as_name
    p.write_bytes(gzip.decompress((DATA / name).read_bytes()))
    return p


def _console_rows() -> dict[str, list[float]]:
    """Their 'Request Latency Statistics' rows: strategy -> the numbers of the row (request
    latency mean/median/p95 in s, TTFT mean/median/p95, TTFOT x3, ITL x3, TPOT x3 in ms)."""
    text = gzip.decompress((DATA / "guidellm-0.8.1-concurrent.console.txt.gz").read_bytes()).decode()
    section = text[text.index("Request Latency Statistics"):]
    section = section[:section.index("Server Throughput")]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0].startswith("concurrent@"):
            rows[cells[0]] = [float(re.match(r"[\d.]+", c).group()) for c in cells[1:]]
    return rows


def test_guidellm_file_round_trips_against_its_console(tmp_path, monkeypatch, capsys):
    f = _unzip(tmp_path, "guidellm-0.8.1-concurrent.benchmarks.json.gz", "benchmarks.json")
    db = tmp_path / "s.db"
    code, out, err = cli(monkeypatch, capsys, "import", "guidellm", str(f), "--store", str(db),
                         "--json")
    assert code == 0, err
    ids = json.loads(out)["load_point_ids"]
    assert len(ids) == 2
    rows = _console_rows()
    with Store(db) as st:
        for lp_id, (strategy, c) in zip(ids, (("concurrent@2", 2), ("concurrent@4", 4)),
                                        strict=True):
            lp = st.load_point(lp_id)
            s = lp.summary
            assert lp.load_key == f"c={c}" and s["concurrency"] == c
            row = rows[strategy]
            ttft, itl, tpot = row[3:6], row[9:12], row[12:15]
            # their console rounds to 0.1 ms: ours must be within half of that
            for ours, theirs in zip((s["ttft_ms"]["mean"], s["ttft_ms"]["median"],
                                     s["ttft_ms"]["p95"]), ttft, strict=True):
                assert abs(ours - theirs) <= 0.05 + 1e-9, (strategy, ours, theirs)
            # their ITL is our TPOT; their TPOT (E2E / n, TTFT included) is not
            for ours, theirs in zip((s["tpot_ms"]["mean"], s["tpot_ms"]["median"],
                                     s["tpot_ms"]["p95"]), itl, strict=True):
                assert abs(ours - theirs) <= 0.05 + 1e-9, (strategy, ours, theirs)
            assert abs(s["e2e_per_token_ms"]["mean"] - tpot[0]) <= 0.05 + 1e-9
            assert s["completed"] + s["failed"] == 24 and s["failure_reasons"] == {
                "http_500": s["failed"]}
            reqs = list(st.requests(lp))
            assert len(reqs) == 24 and sum(not r["ok"] for r in reqs) == s["failed"]
            # per request, their ITL is our (E2E - TTFT) / (n - 1)
            for r in reqs:
                if r["ok"]:
                    tp = (r["e2e_ms"] - r["ttft_ms"]) / (r["output_tokens"] - 1)
                    assert abs(r["tpot_ms"] - tp) < 0.05 * tp, r
    assert s["protocol"] == "openai-chat" and lp.model == "scripted-model"
    # idempotent: the same bytes again store nothing
    code, out, _ = cli(monkeypatch, capsys, "import", "guidellm", str(f), "--store", str(db),
                       "--json")
    assert code == 0 and json.loads(out)["imported_before"] is True


def test_guidellm_logged_throughput_matches(tmp_path):
    """Their progress log printed output_tokens/s=299.37 for concurrent@2: total output tokens
    over the benchmark's duration, our definition too."""
    f = _unzip(tmp_path, "guidellm-0.8.1-concurrent.benchmarks.json.gz", "b.json")
    with Store(tmp_path / "s.db") as st:
        ids, _ = import_file(st, "guidellm", f)
        s = st.load_point(ids[0]).summary
    assert round(s["output_throughput_tok_s"], 2) == 299.37


@pytest.mark.parametrize("mutate,word", [
    (lambda d: d.pop("benchmarks"), "'benchmarks' list"),
    (lambda d: d["benchmarks"][1].update(duration=-1), "benchmark 2 of 2: 'duration'"),
    (lambda d: d["benchmarks"][0]["metrics"]["time_to_first_token_ms"]["successful"].update(
        mean="x"), "time_to_first_token_ms: 'mean'"),
    (lambda d: d["benchmarks"][0]["config"]["strategy"].update(type_="weird"), "strategy"),
    (lambda d: d["benchmarks"][0]["requests"]["successful"][3].update(output_tokens=-2),
     "requests.successful[3]: 'output_tokens'"),
])
def test_a_bad_entry_refuses_the_whole_file(tmp_path, mutate, word):
    doc = json.loads(gzip.decompress(
        (DATA / "guidellm-0.8.1-concurrent.benchmarks.json.gz").read_bytes()))
    mutate(doc)
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(doc))
    with Store(tmp_path / "s.db") as st:
        with pytest.raises(UserError) as exc:
            import_file(st, "guidellm", f)
        assert word in str(exc.value) and "nothing was imported" in str(exc.value)
        assert "\n" not in str(exc.value)
        assert st.load_points() == []
