"""`servelab compare A B` on two bench results from scripted servers with known timings."""

from __future__ import annotations

import orjson
import pytest

from servelab.bench.config import BenchConfig, LoadPoint, WorkloadConfig
from servelab.bench.run import run_load_point, save_load_point
from servelab.bench.scripted.harness import serve_in_thread
from servelab.bench.scripted.script import Script
from servelab.errors import UserError
from servelab.experiment.report.compare import compare
from servelab.store import Store


def _bench(store, gap_ms, output_len=9):
    with serve_in_thread(Script(ttft_ms=5, gap_ms=gap_ms)) as srv:
        cfg = BenchConfig(
            base_url=srv.url,
            workload=WorkloadConfig(input_len=8, output_len=output_len, num_prompts=12),
        )
        load = LoadPoint(concurrency=2)
        res = run_load_point(cfg, load, progress=False)
        lp = save_load_point(store, cfg, load, res, label=f"gap{gap_ms}")
    return lp, res.summary


def _row(res, label):
    return next(r for r in res.rows if r[1] == label)


def test_compare_ids_and_output_files(tmp_path):
    store = Store(tmp_path / "r.db")
    a, sum_a = _bench(store, 4)
    b, sum_b = _bench(store, 12)
    res = compare(store, str(a), str(b))
    tpot = _row(res, "TPOT median (ms)")
    # scripted truth: TPOT = gap, so B/A = 3 (server-side sleep overshoot only adds a little)
    assert 2.0 < float(tpot[4]) < 3.3 and tpot[6] == "worse" and "[" in tpot[5]
    tput = _row(res, "output throughput (tok/s)")
    assert float(tput[4]) < 0.6 and tput[6] == "worse (1 run, no CI)"
    assert float(tput[4]) == pytest.approx(
        sum_b["output_throughput_tok_s"] / sum_a["output_throughput_tok_s"], rel=1e-3
    )
    assert res.warnings == []
    fa, fb = tmp_path / "a.json", tmp_path / "b.json"
    fa.write_bytes(orjson.dumps({"provenance": {}, "load_points": [{**sum_a, "store_id": a}]}))
    fb.write_bytes(orjson.dumps({"provenance": {}, "load_points": [{**sum_b, "store_id": None}]}))
    res2 = compare(store, str(fb), str(fa))
    tpot2 = _row(res2, "TPOT median (ms)")
    assert float(tpot2[4]) == pytest.approx(1 / float(tpot[4]), rel=1e-3)
    assert tpot2[6] == "better (1 run, no CI)"  # no records on one side: no CI


def test_compare_flags_a_different_workload(tmp_path):
    store = Store(tmp_path / "r.db")
    a, _ = _bench(store, 4)
    b, _ = _bench(store, 4, output_len=17)
    res = compare(store, str(a), str(b))
    assert any("output_len is 9 in A, 17 in B" in w for w in res.warnings)
    with pytest.raises(UserError, match="neither a load point id nor a file"):
        compare(store, str(a), "nope.json")
