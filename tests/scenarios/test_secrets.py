"""No secret written anywhere: generated secrets in every place an experiment file can hold them
(flags, env, arms, URLs, the command) are searched for in the store, the logs, the reports, the
`--check` plan and `--json` documents. Before: `[base.flags]`, `[base.env]` and arms' flags/env
were stored verbatim in results.db, rendered in report.html, printed by `run --check --json`, and
the launch line `$ ... --api-key sk-...` was written to a 0644 log."""

from __future__ import annotations

import io
import json
import stat
import sys
import uuid

from cli_inproc import cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servelab import jsonout
from servelab.console import make_console
from servelab.experiment.design.parse import parse
from servelab.experiment.plan import check
from servelab.experiment.present import attribution
from servelab.experiment.report.document import experiment_document
from servelab.experiment.report.html import write
from servelab.store import Store

SECRET = st.text(alphabet="ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz23456789", min_size=12,
                 max_size=32).map(lambda s: "zz" + s)
FLAG = st.sampled_from(["api-key", "hf-token", "admin-api-key", "password", "client-secret"])
ENV = st.sampled_from(["HF_TOKEN", "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN"])


def _spec_dict(secrets: list[str], flag: str, env: str) -> dict:
    s = secrets
    return {
        "name": "sec", "engine": "command", "baseline": "a",
        "command": [sys.executable, "-m", "servelab.bench.scripted", "--host", "{host}", "--port",
                    "{port}", "--model", "sec", "--no-log"],
        "base": {"flags": {flag: s[0], "ttft-ms": 1},
                 "env": {env: s[1], "DATABASE_URL": f"postgres://app:{s[2]}@db.internal/x",
                         "PROXY": f"http://u:{s[3]}@proxy:3128", "NOTE": f"export {env}={s[4]}"}},
        "arms": {"a": {}, "b": {"flags": {flag: s[5]}, "env": {env: s[6]}}},
        "load": {"concurrency": [1]},
        "workload": {"input_len": 4, "output_len": 3, "num_prompts": 2},
    }


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(secrets=st.lists(SECRET, min_size=7, max_size=7, unique=True), flag=FLAG, env=ENV)
def test_generated_secrets_reach_no_file_report_document_or_console_line(tmp_path, secrets, flag,
                                                                         env):
    """60 generated designs (5 flag names x 4 env names, fresh secrets each) through what a run
    stores (a results store in its own home), the report it writes (markdown, HTML), `report
    --json`, the attribution printed on the console, and what `run --check` prints (lines and
    --json)."""
    spec = parse(_spec_dict(secrets, flag, env))
    home = tmp_path / uuid.uuid4().hex               # tmp_path is shared by the examples
    with Store(home / "results.db") as store:
        store.ensure_experiment(spec.name, spec.to_json(), spec.design_hash())
        md, page, data = write(store, spec.name, home / "reports" / spec.name)
    console = make_console(file=io.StringIO(), width=160)
    attribution(console, data)
    plan = check.collect(spec)
    texts = {str(p.relative_to(home)): p.read_bytes() for p in home.rglob("*") if p.is_file()}
    texts |= {"report --json": jsonout.dumps(experiment_document(data, {})).encode(),
              "console": console.file.getvalue().encode(),
              "run --check --json": jsonout.dumps(jsonout.document("experiment_check", plan)).encode(),
              "run --check": "\n".join(check.lines(plan)).encode()}
    assert {"results.db", f"reports/{spec.name}/report.md", f"reports/{spec.name}/report.html"} <= set(texts)
    for where, blob in texts.items():
        for s in secrets:
            assert s.encode() not in blob, f"{s} in {where}"
    assert b"<redacted>" in texts["run --check --json"]


def test_a_real_run_leaves_no_secret_under_servelab_home(tmp_path, monkeypatch, capsys,
                                                        _servelab_home):
    secrets = [f"zzSecret{i}xQ7v" for i in range(7)]
    key = secrets[0]
    d = _spec_dict(secrets, "api-key", "HF_TOKEN")
    d["arms"]["b"] = {"env": {"HF_TOKEN": secrets[6]}}   # both arms serve with the same key
    d["repetitions"] = 1
    f = tmp_path / "sec.toml"
    f.write_text(_toml(d))
    monkeypatch.setenv("SERVELAB_API_KEY", key)         # what the bench sends to the server
    outputs = []
    for args in (["run", str(f)], ["run", str(f), "--check", "--json"], ["report", "sec"],
                 ["report", "sec", "--json"]):
        code, out, err = cli(monkeypatch, capsys, *args)
        assert code == 0, err
        outputs += [out, err]
    files = [p for p in _servelab_home.rglob("*") if p.is_file()]
    logs = [p for p in files if p.suffix == ".log"]
    assert logs and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in logs)
    assert any(b"--api-key '<redacted>'" in p.read_bytes() or b"--api-key <redacted>"
               in p.read_bytes() for p in logs)
    blobs = [p.read_bytes() for p in files] + [o.encode() for o in outputs]
    for s in secrets:
        assert not any(s.encode() in b for b in blobs), s
    assert json.loads(outputs[6])["schema"].startswith("servelab.experiment/")


def _toml(d: dict) -> str:
    """The dict as an experiment file (json values are valid TOML values here)."""
    top = [f"{k} = {json.dumps(v)}" for k, v in d.items() if not isinstance(v, dict)]
    out = "\n".join(top) + "\n"
    for table in ("base", "arms"):
        for k, v in d[table].items():
            out += f"[{table}.{k}]\n" + "".join(f"{kk} = {json.dumps(vv)}\n" for kk, vv in v.items()
                                                if not isinstance(vv, dict))
            for kk, vv in v.items():
                if isinstance(vv, dict):
                    out += f"[{table}.{k}.{kk}]\n" + "".join(
                        f"{json.dumps(a)} = {json.dumps(b)}\n" for a, b in vv.items())
    for table in ("load", "workload"):
        out += f"[{table}]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in d[table].items())
    return out
