"""What the runner decides with and the report states (experiment/stats/evidence.py): the stored
spec read back as the typed model, so its defaults live in one place, and a store written by an
earlier release (keys since added missing, a key since dropped, an engine since renamed) opens
and reports as one written now."""

from __future__ import annotations

import copy

from servelab.experiment.design.parse import from_store, parse
from servelab.experiment.report.data import collect
from servelab.experiment.report.markdown import markdown
from servelab.experiment.stats import evidence
from servelab.store import Store

FILE = {
    "name": "ab", "hypothesis": "b is faster", "engine": "sglang", "model": "m",
    "arms": {"a": {}, "b": {"flags": {"chunked-prefill-size": 4096}}}, "baseline": "a",
    "load": {"concurrency": [1]}, "repetitions": 4,
}


def _store(tmp_path, stored: dict) -> Store:
    """An experiment stored with `stored` as its spec and four blocks of two ok runs."""
    st = Store(tmp_path / "r.db")
    st.ensure_experiment("ab", stored, "h")
    seq = 0
    for b in range(4):
        for arm, tput in (("a", 100.0), ("b", 150.0)):
            summary = {"output_throughput_tok_s": tput * (1 + 0.01 * b), "completed": 4,
                       "failed": 0, "ttft_ms": {"median": 20.0}, "tpot_ms": {"median": 5.0}}
            lp = st.add_load_point(summary=summary, provenance={"host": "h"}, load_key="c=1",
                                   source="experiment", label=f"ab/{arm}", concurrency=1)
            st.add_run(experiment="ab", arm=arm, load_key="c=1", repetition=b, block=b, seq=seq,
                       status="ok", load_point_id=lp, started=1e9 + seq, finished=1e9 + seq + 1)
            seq += 1
    return st


def test_the_stored_spec_reads_back_as_the_typed_model():
    spec = parse(FILE)
    assert from_store(spec.to_json()) == spec  # as the runner stores it (ExperimentSpec.to_json)


def _older(stored: dict) -> dict:
    """`stored` as an earlier release might have written it."""
    old = copy.deepcopy(stored)
    for k in ("noise", "adaptive", "placement", "ray_address", "noise_band", "primary_metric",
              "timeouts", "retries"):
        old.pop(k, None)
    old["workload"].pop("goodput", None)
    old["engine"] = "sglang-legacy"  # an engine name this release no longer knows
    old["retired_key"] = True  # a key this release dropped
    old["base"]["retired_flag_table"] = "x"
    return old


def test_a_spec_an_earlier_release_stored_still_reads_with_todays_defaults():
    spec = from_store(_older(parse(FILE).to_json()))
    assert spec.noise_band == 0.02 and spec.primary_metric == "output_throughput_tok_s"
    assert spec.engine == "sglang-legacy" and spec.noise.on_interference == "record"


def test_a_store_written_by_an_earlier_release_reports_unchanged(tmp_path):
    now = parse(FILE).to_json()
    a, b = tmp_path / "now", tmp_path / "old"
    a.mkdir(), b.mkdir()
    with _store(a, now) as st_now, _store(b, _older(now)) as st_old:
        ev_now, ev_old = evidence.gather(st_now, "ab"), evidence.gather(st_old, "ab")
        assert ev_old.analysis == ev_now.analysis and ev_old.blocks_used == 4
        assert ev_old.stored["retired_key"] is True  # shown as stored
        md_now, md_old = markdown(collect(st_now, "ab")), markdown(collect(st_old, "ab"))
    assert md_old.replace("sglang-legacy", "sglang") == md_now
    assert "b vs a, output throughput" in md_now and "better" in md_now
