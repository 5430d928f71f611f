"""`servelab demo --quick`: the story's A/B in miniature on the embedded engine, end to end."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from collections import defaultdict

import numpy as np

from servelab.experiment.demo import DEMO_FILE, load_demo
from servelab.store import Store


def test_demo_quick_runs_attributes_and_reports(tmp_path):
    spec = load_demo(None, quick=False)
    assert DEMO_FILE.is_file() and list(spec.arms) == ["baseline", "mtp"]
    assert spec.load.concurrency == [1, 16] and spec.order == "interleaved"
    # the demo decides adaptively, within a budget that keeps `make demo` under 5 minutes
    assert spec.repetitions == "auto" and spec.adaptive.budget_s <= 260
    quick = load_demo(None, quick=True)
    assert (quick.adaptive.min, quick.adaptive.max) == (3, 3) and quick.name == "demo-quick"
    home = tmp_path / "home"
    env = {**os.environ, "SERVELAB_HOME": str(home), "COLUMNS": "250"}
    p = subprocess.run(
        [sys.executable, "-m", "servelab", "demo", "--quick"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out = p.stdout
    page = re.search(r"report: (\S+report\.html)", out)
    assert page and os.path.getsize(page.group(1)) > 20_000
    with Store(home / "results.db") as st:
        runs = st.runs("demo-quick")
        assert len(runs) == 12 and all(r.status == "ok" for r in runs)
        # interleaved: the first block starts with the baseline, the second with mtp
        firsts = [next(r.arm for r in runs if r.block == b) for b in range(3)]
        assert firsts == ["baseline", "mtp", "baseline"]
        tput = defaultdict(dict)
        for r in runs:
            tput[(r.arm, r.load_key)][r.block] = st.load_point(r.load_point_id).summary[
                "output_throughput_tok_s"
            ]
    # the printed effect at c=1 is the geometric mean of the per-block ratios (recomputed here)
    ratios = [tput[("mtp", "c=1")][b] / tput[("baseline", "c=1")][b] for b in range(3)]
    want = (math.exp(np.mean(np.log(ratios))) - 1) * 100
    line = next(x for x in out.splitlines() if x.startswith("mtp vs baseline, output throughput"))
    got = float(
        re.search(r"([+-]\d+\.\d)% (?:\[[^\]]*\] )?at c=1|at c=1 \(([+-]\d+\.\d)%", line)
        .group(0)
        .split("%")[0]
        .split("(")[-1]
    )
    assert abs(got - want) < 0.051, (line, want)
    # the stopping rule and the machine are reported beside the verdicts
    assert "adaptive repetitions: 3 blocks used" in out
    assert "rule: repeated-t confidence sequence" in out


def test_demo_json_prints_only_the_experiment_document(tmp_path):
    """`servelab demo --file F --json`: stdout holds the report's `experiment` document and
    nothing else (progress and the timing go to stderr); the report files it names exist."""
    import json

    from capacity_files import scripted_capacity

    f = tmp_path / "d.toml"
    f.write_text(scripted_capacity("demoj", 'repetitions = 1\nrestart = "block"'))
    env = {**os.environ, "SERVELAB_HOME": str(tmp_path / "home"), "COLUMNS": "250"}
    p = subprocess.run([sys.executable, "-m", "servelab", "demo", "--file", str(f), "--json"],
                       env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    doc = json.loads(p.stdout)  # the whole of stdout is one document
    assert doc["schema"] == "servelab.experiment/1" and doc["name"] == "demoj"
    assert doc["runs"] == {"stored": 2, "ok": 2}
    assert [a["paired_sweeps"] for a in doc["capacity"]["arms"]] == [1, 1]
    assert os.path.getsize(doc["report"]["html"]) > 20_000
    assert "demo finished in" in p.stderr
