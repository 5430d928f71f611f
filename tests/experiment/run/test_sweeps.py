"""Paired capacity sweeps ([load.sweep] paired, experiment/run/sweeps.py measure_paired): the
arms' searches alternate point by point against real scripted servers on loopback, each arm
still finds its own bracket, and one arm's failure leaves the other's sweep whole."""

from __future__ import annotations

import math
import tomllib

from capacity_files import scripted_capacity

from servelab.bench.scripted.harness import serve_subprocess
from servelab.bench.scripted.script import Script
from servelab.bench.slo import parse_slo
from servelab.bench.sweep import SweepConfig, first_crossing, judge
from servelab.experiment.design.parse import parse
from servelab.experiment.plan.schedule import PlannedRun
from servelab.experiment.run import sweeps

SLO = "ttft_p90_ms=40"
SWEEP = f'slo = "{SLO}", precision = 0.5, rates = 1, max_points = 8'


def _file(restart: str = "block", paired: str = "true") -> str:
    return scripted_capacity("capp", f'repetitions = 1\nrestart = "{restart}"',
                             f"{SWEEP}, paired = {paired}")


def _run(arm: str, seq: int) -> PlannedRun:
    return PlannedRun(seq=seq, arm=arm, load_key="capacity", concurrency=None, request_rate=None,
                      repetition=0, block=0, group=0)


def _rejudged(m) -> tuple[float | None, float | None]:
    """The bracket recomputed from the measurement's own points (an independent reading)."""
    slo = parse_slo(SLO)
    pts = [(m.summary["capacity"]["load"]["request_rate"], m.summary)]
    pts += [(x["request_rate"], x["summary"]) for x in m.extra_points]
    # judged as the sweep judges: the SLOs, and a point whose queue rose all along misses
    cfg = SweepConfig(slo=slo)
    rated = [(r, judge(cfg, s["sweep"]["role"], s).met) for r, s in pts
             if r is not None and math.isfinite(r)]
    lo, hi, _ = first_crossing(rated)
    return lo, hi


def test_paired_sweeps_alternate_point_by_point_against_real_servers(tmp_path):
    spec = parse(tomllib.loads(_file()))
    slow = Script(ttft_ms=5, gap_ms=4, max_running=1, model="capp")
    fast = Script(ttft_ms=5, gap_ms=4, max_running=1, model="capp", tokens_per_chunk=2)
    seen: list[tuple[str, int, int]] = []  # (arm about to measure, requests served by each so far)
    with serve_subprocess(slow) as hs, serve_subprocess(fast) as hf:
        def on_point(run, role, key):
            seen.append((run.arm, len(hs.log()), len(hf.log())))

        out = sweeps.measure_paired([(hs.url, spec, _run("slow", 0)),
                                       (hf.url, spec, _run("fast", 1))], on_point)
    ms, mf = out
    assert not isinstance(ms, BaseException) and not isinstance(mf, BaseException)
    n_slow, n_fast = 1 + len(ms.extra_points), 1 + len(mf.extra_points)
    assert [a for a, _, _ in seen] == (["slow", "fast"] * min(n_slow, n_fast)
                                       + ["slow" if n_slow > n_fast else "fast"]
                                       * abs(n_slow - n_fast))
    # the servers agree: between two points of one arm, the other arm's server was busy
    for (a1, s1, f1), (a2, s2, f2) in zip(seen, seen[1:], strict=False):
        if a1 == a2 == "slow" or a1 == a2 == "fast":
            continue  # the other sweep had ended
        if a1 == "slow":
            assert s2 > s1 and f2 == f1  # the slow server served a point, the fast one waited
        else:
            assert f2 > f1 and s2 == s1
    for m, other in ((ms, ["fast"]), (mf, ["slow"])):
        cap = m.summary["capacity"]
        assert cap["paired_with"] == other and cap["low_req_s"] > 0
        assert (cap["low_req_s"], cap["high_req_s"]) == _rejudged(m)
    # two tokens per chunk halve the decode time: the fast arm sustains more
    assert mf.summary["capacity"]["low_req_s"] > ms.summary["capacity"]["low_req_s"]


def test_a_failing_arm_leaves_the_other_sweep_whole(tmp_path):
    spec = parse(tomllib.loads(_file()))
    ok = Script(ttft_ms=5, gap_ms=4, max_running=1, model="capp")
    broken = Script(ttft_ms=5, gap_ms=4, max_running=1, model="capp", fail_rate=1.0)
    calls: list[str] = []
    with serve_subprocess(broken) as hb, serve_subprocess(ok) as ho:
        out = sweeps.measure_paired([(hb.url, spec, _run("broken", 0)),
                                       (ho.url, spec, _run("ok", 1))],
                                      lambda run, role, key: calls.append(run.arm))
    assert isinstance(out[0], RuntimeError) and "completed no request" in str(out[0])
    assert calls.count("broken") == 1  # its synchronous point failed; the rest ran alone
    m = out[1]
    # paired with nobody: the broken arm's sweep ended at its first point
    assert m.summary["capacity"]["low_req_s"] > 0 and m.summary["capacity"]["paired_with"] == []
    assert (m.summary["capacity"]["low_req_s"], m.summary["capacity"]["high_req_s"]) == _rejudged(m)


