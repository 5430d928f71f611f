"""`profile DIR`: every rank of a TP trace set, assembled from the real H200 graph trace.

Rank 0 is `engine_graph.json.gz` with an NCCL all-reduce (30 us, on its own stream) appended to
every step, starting 10 us before the step's last compute kernel ends; rank 1 is rank 0 with
every time and duration x1.1 (a slower GPU). By hand: rank 1's compute is 1.1 x rank 0's, so
the imbalance is 1 - 1/1.1 = 9.09%; each rank's communication is 10 steps x 30 us (x1.1 on rank
1), and at most 10 us (11 us) of each all-reduce overlaps compute. The figures are checked
against that and against numpy sweeps over the raw events (fixtures/phase_truth.py).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servelab.cli import app
from servelab.errors import UserError
from servelab.profile.ranks import analyze_ranks, rank_files

FIX = Path(__file__).parent / "fixtures"
_spec = importlib.util.spec_from_file_location("phase_truth", FIX / "phase_truth.py")
truth = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(truth)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> tuple[Path, list[list[dict]]]:
    d = tmp_path_factory.mktemp("tp2")
    r0 = truth.with_allreduce(truth.load(FIX / "engine_graph.json.gz"))
    r1 = truth.slowed(r0, 1.1)
    truth.write(d / "1795982621-TP-0.trace.json.gz", r0)
    truth.write(d / "1795982621-TP-1.trace.json.gz", r1)
    (d / "notes.txt").write_text("not a trace")
    return d, [r0, r1]


def test_two_ranks_imbalance_and_overlap_by_hand(two_ranks):
    d, raw = two_ranks
    rep = analyze_ranks(d)
    assert rep["n_ranks"] == 2 and [r["rank"] for r in rep["ranks"]] == [0, 1]
    r0, r1 = rep["ranks"]
    # x1.1 by hand holds to the rounding of the scaled times: they are ~5.1e12 us, where a
    # double's spacing is ~1e-3 us, over ~9,000 interval ends: rel 1e-4 of ~22,000 us is 2 us
    assert r1["compute_us"] == pytest.approx(1.1 * r0["compute_us"], rel=1e-4)
    assert rep["compute_imbalance"] == pytest.approx(1 - 1 / 1.1, rel=1e-4)
    assert rep["slowest_rank"] == 1 and rep["fastest_rank"] == 0
    assert r0["n_steps"] == 10 and r0["n_warmup"] == 0
    assert r0["comm_us"] == pytest.approx(10 * 30.0, rel=1e-9)
    assert r1["comm_us"] == pytest.approx(10 * 33.0, rel=1e-4)
    assert 0 < r0["overlap_us"] <= 10 * 10.0 + 1e-6
    for got, ev in zip((r0, r1), raw, strict=True):
        want = truth.rank_figures(ev, lambda g: g["name"] == truth.NCCL)
        assert got["compute_us"] == pytest.approx(want["compute_us"], rel=1e-9)
        assert got["comm_us"] == pytest.approx(want["comm_us"], rel=1e-9)
        assert got["overlap_us"] == pytest.approx(want["overlap_us"], rel=1e-9)
        assert got["exposed_comm_us"] == pytest.approx(want["comm_us"] - want["overlap_us"])
        assert 0 < got["busy_share"] < 1


def test_profile_dir_prints_the_ranks_then_rank_0(two_ranks, tmp_path):
    d, _ = two_ranks
    out = tmp_path / "r.json"
    res = CliRunner().invoke(app, ["profile", str(d), "--output-file", str(out)])
    assert res.exit_code == 0, res.output
    first = res.output.lstrip().splitlines()[0]
    assert first.startswith("2 ranks: compute imbalance 9.1% (rank 1 slowest, 0 fastest)")
    doc = json.loads(out.read_text())
    assert doc["ranks"]["n_ranks"] == 2 and doc["trace"].endswith("-TP-0.trace.json.gz")
    cats = {c["category"] for c in doc["phases"]["DECODE"]["categories"]}
    assert "communication" in cats


def test_rank_files_pick_the_newest_set_and_explain_an_empty_folder(tmp_path):
    import os

    for pid, t in (("100", 1_000), ("200", 2_000)):
        for r in (0, 1):
            p = tmp_path / f"{pid}-TP-{r}.trace.json.gz"
            p.write_bytes(b"")
            os.utime(p, (t, t))
    assert [(r, p.name) for r, p in rank_files(tmp_path)] == [
        (0, "200-TP-0.trace.json.gz"), (1, "200-TP-1.trace.json.gz")]
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "a.txt").write_text("")
    with pytest.raises(UserError, match="no per-rank traces.*a.txt"):
        rank_files(empty)


def test_ranks_are_read_one_at_a_time(two_ranks, monkeypatch):
    """Bounded memory: each rank's trace is gone before the next one is read."""
    import gc

    from servelab.profile import ranks
    from servelab.profile.trace import Trace

    folder = str(two_ranks[0])
    live: list[int] = []
    real = ranks.read_trace

    def reading(*a, **kw):
        gc.collect()
        live.append(sum(1 for o in gc.get_objects()
                        if type(o) is Trace and o.path.startswith(folder)))
        return real(*a, **kw)

    monkeypatch.setattr(ranks, "read_trace", reading)
    assert analyze_ranks(two_ranks[0])["n_ranks"] == 2
    assert live == [0, 0]  # no earlier rank's trace alive when the next is read
