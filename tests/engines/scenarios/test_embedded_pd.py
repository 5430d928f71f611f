"""The embedded engine's PD roles as an experiment sees them, and serve's typed flags.

`run --check` of examples/disagg_embedded.toml renders prefill, decode and router commands with
a per-process bootstrap port; a short real PD experiment runs to a report; a value `servelab
serve` refuses (num-threads -4, ...) is refused by `run --check` with the same message."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from servelab import engines
from servelab.engines.base import ProcessConfig, ProcessPlan
from servelab.errors import UserError
from servelab.mini.server.args import ServeArgs

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "disagg_embedded.toml"


def servelab(*args: str, home: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "SERVELAB_HOME": str(home), "COLUMNS": "250"}
    return subprocess.run([sys.executable, "-m", "servelab", *args], capture_output=True,
                          text=True, env=env, timeout=timeout)


def test_check_of_the_example_shows_the_three_commands(tmp_path):
    r = servelab("run", str(EXAMPLE), "--check", home=tmp_path)
    assert r.returncode == 0, r.stderr
    for arm in ("baseline", "mtp"):
        block = r.stdout.split(f"arm {arm}:")[1].split("arm ")[0]
        pre = re.search(r"\[prefill\] .*? -m servelab serve .*--port (\d+) --disaggregation-mode "
                        r"prefill .*--disaggregation-bootstrap-port (\d+)", block)
        dec = re.search(r"\[decode\] .*? -m servelab serve .*--port (\d+) --disaggregation-mode "
                        r"decode", block)
        rtr = re.search(r"\[router\] .*? -m servelab router --pd-disaggregation --prefill "
                        r"http://127.0.0.1:(\d+) (\d+) --decode http://127.0.0.1:(\d+) ", block)
        assert pre and dec and rtr, block
        assert (rtr[1], rtr[2], rtr[3]) == (pre[1], pre[2], dec[1])
        assert ("--speculative-algorithm EAGLE" in block) == (arm == "mtp")
        assert "--disaggregation-bootstrap-port" not in block.split("[decode]")[1]


def test_adapter_renders_roles_like_sglang():
    eng = engines.get("embedded")
    pre = ProcessPlan("prefill", [], {}, "127.0.0.1", 31, "", "http://127.0.0.1:31")
    dec = ProcessPlan("decode", [], {}, "127.0.0.1", 32, "", "http://127.0.0.1:32")
    argv = eng.args(ProcessConfig(role="router", flags={"policy": "random"}, port=33,
                                  extra={"bootstrap_port:31": 8998}),
                    "tiny", {"prefill0": pre, "decode1": dec})
    assert argv == ["router", "--pd-disaggregation", "--prefill", "http://127.0.0.1:31", "8998",
                    "--decode", "http://127.0.0.1:32", "--host", "127.0.0.1", "--port", "33",
                    "--policy", "random"]
    assert eng.port_flags("prefill") == ("disaggregation-bootstrap-port",)
    assert eng.port_flags("decode") == eng.port_flags("router") == ()
    assert "knows round_robin" in eng.check("tiny", "router", {"policy": "cache_aware"})[0]
    assert "must be > 0" in eng.check("tiny", "router", {"request-timeout-secs": -1})[0]
    assert eng.check("tiny", "prefill", {"disaggregation-mode": "decode"})  # comes from the role


@pytest.mark.parametrize(("flag", "value", "why"), [
    ("num-threads", -4, "--num-threads -4: must be >= 1"),
    ("max-running-requests", 100000, "--max-running-requests 100000: must be <= 65536"),
    ("disaggregation-bootstrap-port", 70000, "--disaggregation-bootstrap-port 70000: must be <= 65535"),
    ("attention-backend", "flash", "--attention-backend 'flash': input should be 'torch'"),
    ("num-threads", True, "--num-threads True: must be an integer, not a boolean"),
    ("page-size", 0, "--page-size 0: must be >= 1"),
    # what the engine refuses once loaded, judged before: 4096 positions, 1 draft + 2 spare
    ("context-length", 4094, "--context-length 4094 is too long for config tiny: at most 4093"),
])
def test_typed_flags_name_the_flag_the_value_and_the_bound(flag, value, why):
    spec = {"speculative-algorithm": "EAGLE"} if flag == "context-length" else {}
    with pytest.raises(UserError) as ei:
        ServeArgs.from_flags({flag: value, **spec})
    assert str(ei.value).startswith(why)
    assert any(why in p for p in engines.get("embedded").check("tiny", "server",
                                                                {flag: value, **spec}))


def test_the_radix_cache_flags_pass_the_preflight_and_render_as_sglang_spells_them():
    eng = engines.get("embedded")
    flags = {"disable-radix-cache": True, "page-size": 32}
    assert eng.check("tiny", "server", flags) == []
    assert eng.check("tiny", "prefill", flags) == []
    argv = eng.args(ProcessConfig(role="server", flags=flags, port=31), "tiny", {})
    assert argv[-5:-2] == ["--disable-radix-cache", "--page-size", "32"]
    assert ServeArgs.from_flags({}).disable_radix_cache is False  # on by default, as SGLang


def test_num_threads_minus_4_refused_by_check_and_serve_with_one_message(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text(EXAMPLE.read_text().replace("num-threads = 1", "num-threads = -4"))
    checked = servelab("run", str(f), "--check", home=tmp_path)
    served = servelab("serve", "--num-threads", "-4", "--port", "1", home=tmp_path)
    msg = "--num-threads -4: must be >= 1"
    assert checked.returncode == served.returncode == 2
    assert msg in checked.stderr and "(prefill)" in checked.stderr, checked.stderr
    assert served.stderr.strip() == f"error: {msg}"
    assert "Traceback" not in checked.stderr + served.stderr


def test_a_short_pd_experiment_reaches_a_report(tmp_path):
    text = EXAMPLE.read_text()
    for old, new in (("repetitions = 3", "repetitions = 1"), ("concurrency = [1, 4]",
                     "concurrency = [2]"), ("num_prompts = 16", "num_prompts = 4"),
                     ("output_len = 32", "output_len = 8"), ("warmup = 2", "warmup = 0")):
        assert old in text
        text = text.replace(old, new)
    f = tmp_path / "pd.toml"
    f.write_text(text)
    db = tmp_path / "r.db"
    r = servelab("run", str(f), "--store", str(db), home=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rep = servelab("report", "tiny-pd-mtp", "--store", str(db), "--out", str(tmp_path / "rep"),
                   home=tmp_path)
    assert rep.returncode == 0, rep.stderr
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "mtp" in md and "baseline" in md
    from servelab.store import Store

    with Store(db) as st:
        runs = st.runs("tiny-pd-mtp")
        assert sorted(r.status for r in runs) == ["ok", "ok"]
        points = {p.provenance["arm"]: p.provenance for p in st.load_points()}
    # the bench went through the router to a decode server fed by a prefill server, and MTP's
    # acceptance was read through the router's /metrics (the decode worker's counters)
    assert sorted(points) == ["baseline", "mtp"]
    for prov in points.values():
        assert [p["role"] for p in prov["processes"]] == ["prefill", "decode", "router"]
        info = prov["server_info"]
        assert info["disaggregation_mode"] == "decode" and len(info["router"]["prefill"]) == 1
    assert points["mtp"]["spec_window"]["accept_length"] > 1.0
    assert points["baseline"]["spec_window"]["accept_length"] is None


def test_check_does_not_mistake_a_bootstrap_port_for_the_unallocated_http_port():
    """serve refuses --port == --disaggregation-bootstrap-port; the pre-flight, which does not
    know the port a process will get, must not refuse a bootstrap port of 30000 (serve's
    default --port) for that reason."""
    eng = engines.get("embedded")
    assert eng.check("tiny", "prefill", {"disaggregation-bootstrap-port": 30000}) == []
    assert eng.check("tiny", "prefill", {"disaggregation-bootstrap-port": 1}) == []


def test_serve_refuses_a_context_too_long_as_run_check_does(tmp_path):
    """The same line before loading (serve) and without starting anything (run --check)."""
    served = servelab("serve", "--context-length", "4095", "--port", "1", home=tmp_path)
    assert served.returncode == 2
    assert served.stderr.strip() == ("error: --context-length 4095 is too long for config tiny: "
                                     "at most 4094")
