"""A disaggregated deployment (prefill + decode + router): started in order, torn down together."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

from servelab.experiment.plan import processes
from servelab.experiment.plan.preflight import load
from servelab.experiment.run.runner import Runner
from servelab.store import Store

ROUTER = Path(__file__).with_name("tiny_router.py")


def test_prefill_decode_router_deployment(tmp_path, live_procs):
    marker = f"pd-{uuid.uuid4().hex[:8]}"
    srv = [
        sys.executable,
        "-m",
        "servelab.bench.scripted",
        "--host",
        "{host}",
        "--port",
        "{port}",
        "--model",
        marker,
        "--no-log",
    ]
    text = f"""
name = "pd"
engine = "command"
baseline = "base"
repetitions = 1
[[base.processes]]
role = "prefill"
command = {srv!r}
flags = {{ ttft-ms = 5, gap-ms = 40 }}
[[base.processes]]
role = "decode"
command = {srv!r}
flags = {{ ttft-ms = 5, gap-ms = 4 }}
[[base.processes]]
role = "router"
command = ["{sys.executable}", "{ROUTER}", "{{port}}", "{{prefill_url}}", "{{decode_url}}",
           "{marker}"]
[arms.base]
[arms.fast-decode]
roles = ["decode"]
flags = {{ tokens-per-chunk = 2 }}
[load]
concurrency = [2]
[workload]
input_len = 8
output_len = 9
num_prompts = 6
[timeouts]
ready_s = 30
teardown_s = 5
""".replace("'", '"')
    f = tmp_path / "pd.toml"
    f.write_text(text)
    spec = load(f)
    procs = processes.resolve(spec, "fast-decode")
    assert [p.role for p in procs] == ["prefill", "decode", "router"]
    assert procs[1].flags["tokens-per-chunk"] == 2 and "tokens-per-chunk" not in procs[0].flags
    store = Store(tmp_path / "r.db")
    res = Runner(spec, store, say=lambda s: None).run()
    assert (res.ok, res.failed) == (2, 0)
    runs = {r.arm: store.load_point(r.load_point_id) for r in store.runs("pd")}
    # traffic went router -> decode: TPOT is the decode server's gap (4 ms), not prefill's 40 ms
    tpot = runs["base"].summary["tpot_ms"]["median"]
    assert 3.5 < tpot < 20, tpot
    assert runs["fast-decode"].summary["tpot_ms"]["median"] < 0.8 * tpot
    argv = runs["base"].provenance["processes"]
    assert [p["role"] for p in argv] == ["prefill", "decode", "router"]
    router_argv = argv[2]["argv"]
    assert router_argv[3:5] == [
        f"http://127.0.0.1:{argv[0]['argv'][6]}",
        f"http://127.0.0.1:{argv[1]['argv'][6]}",
    ]
    from servelab import paths

    logs = sorted(p.name for p in (paths.home() / "experiments" / "pd" / "logs").glob("*/*.log"))
    assert logs == [
        "0-prefill.log",
        "0-prefill.log",
        "1-decode.log",
        "1-decode.log",
        "2-router.log",
        "2-router.log",
    ]  # one log per process per deployment
    assert live_procs(marker) == []  # all three gone
