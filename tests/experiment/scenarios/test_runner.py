"""The runner end to end against the bench's scripted server as a deployable engine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from servelab.experiment.design.parse import parse
from servelab.experiment.plan.preflight import load, preflight
from servelab.experiment.report.data import collect
from servelab.experiment.run.runner import Runner
from servelab.store import Store


def _run(tmp_path, text, name="t"):
    f = tmp_path / f"{name}.toml"
    f.write_text(text)
    spec = load(f)
    lines: list[str] = []
    store = Store(tmp_path / "r.db")
    res = Runner(spec, store, say=lines.append).run()
    return spec, store, res, lines


def test_ab_interleaved_attributes_the_faster_arm(tmp_path, scripted, live_procs):
    text, marker = scripted("ab", reps=3)
    spec, store, res, lines = _run(tmp_path, text, "ab")
    assert (res.ok, res.failed, res.planned) == (12, 0, 12)
    runs = store.runs("ab")
    # ABBA: block 0 slow then fast, block 1 fast then slow, ...; each arm's loads back to back
    assert [(r.arm, r.load_key, r.block) for r in runs[:8]] == [
        ("slow", "c=1", 0),
        ("slow", "c=4", 0),
        ("fast", "c=1", 0),
        ("fast", "c=4", 0),
        ("fast", "c=1", 1),
        ("fast", "c=4", 1),
        ("slow", "c=1", 1),
        ("slow", "c=4", 1),
    ]
    assert [r.arm for r in runs[8:]] == ["slow", "slow", "fast", "fast"]
    data = collect(store, "ab")
    # scripted truth: TPOT = gap_ms / tokens_per_chunk, so fast/slow TPOT ratio is 0.5
    tpot = data.analysis.effects[("fast", "c=1", "tpot_ms")]
    assert 0.35 < tpot.ratio < 0.75 and tpot.verdict == "better"
    tput = data.analysis.effects[("fast", "c=1", "output_throughput_tok_s")]
    assert tput.ratio > 1.2 and tput.paired
    # each run carries the command that made it and the bench's acceptance (2 tokens per chunk)
    lp = store.load_point(runs[2].load_point_id)
    assert "--tokens-per-chunk" in lp.provenance["processes"][0]["argv"]
    assert live_procs(marker) == []  # nothing outlives the runner


def test_engine_that_never_becomes_ready_is_recorded_and_the_rest_goes_on(
    tmp_path, scripted, live_procs
):
    text, marker = scripted(
        "broken",
        reps=1,
        loads="[2]",
        arms="""
[arms.slow]
[arms.fast]
flags = { no-such-option = 1 }
""",
    )
    spec, store, res, lines = _run(tmp_path, text, "broken")
    runs = {r.arm: r for r in store.runs("broken")}
    assert runs["slow"].status == "ok"
    assert runs["fast"].status == "failed"
    assert "exited with status 2" in runs["fast"].error
    assert "unrecognized arguments: --no-such-option" in runs["fast"].log_tail
    assert sum("attempt" in x for x in lines) == 2  # retried once, then recorded
    assert live_procs(marker) == []


def test_engine_that_hangs_before_ready_is_recorded_with_its_log_and_the_rest_goes_on(
    tmp_path, live_procs
):
    """The runner side of the ready timeout: an arm whose server never answers its health probe
    (stuck 'loading weights') is stored failed with the log tail; later runs still happen."""
    marker = f"hang-arm-{os.getpid()}-{time.monotonic_ns()}"
    code = (
        "import os, runpy, sys, time\n"
        "if os.environ.get('HANG'):\n"
        "    print('loading weights forever', flush=True); time.sleep(60)\n"
        "sys.argv = ['scripted', '--host', sys.argv[1], '--port', sys.argv[2], '--model',"
        " sys.argv[3], '--no-log', *sys.argv[4:]]\n"
        "runpy.run_module('servelab.bench.scripted', run_name='__main__')\n"
    )
    spec = parse(
        {
            "name": "hang",
            "engine": "command",
            "command": [sys.executable, "-c", code, "{host}", "{port}", marker],
            "baseline": "ok",
            "repetitions": 2,
            "retries": 0,
            "base": {"flags": {"ttft-ms": 5, "gap-ms": 2}},
            "arms": {"ok": {}, "hang": {"env": {"HANG": "1"}}},
            "load": {"concurrency": [2]},
            "workload": {"input_len": 8, "output_len": 5, "num_prompts": 4},
            "timeouts": {"ready_s": 1.0, "teardown_s": 5},
        }
    )
    store = Store(tmp_path / "r.db")
    res = Runner(spec, store, say=lambda s: None).run()
    assert (res.ok, res.failed) == (2, 2)
    runs = store.runs("hang")
    assert [(r.arm, r.status) for r in runs] == [
        ("ok", "ok"),
        ("hang", "failed"),
        ("hang", "failed"),
        ("ok", "ok"),  # the experiment went on after the failures
    ]
    for r in runs[1:3]:
        assert "was not ready after 1 s" in r.error and r.load_point_id is None
        assert "loading weights forever" in r.log_tail
    assert live_procs(marker) == []


def _servelab(*args, env=None, **kw):
    return subprocess.Popen(
        [sys.executable, "-m", "servelab", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # Ctrl-C at its default, as in the foreground: a test run started as a shell's
        # background job inherits SIGINT ignored, and the runner would never see it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        **kw,
    )


def test_ctrl_c_leaves_no_engine_and_rerun_completes_only_missing_runs(
    tmp_path, scripted, live_procs
):
    text, marker = scripted("intr", reps=2, prompts=6, gap_ms=15, restart="run")
    f = tmp_path / "intr.toml"
    f.write_text(text)
    env = {**os.environ, "SERVELAB_HOME": str(tmp_path / "home")}
    proc = _servelab("run", str(f), env=env)
    db = tmp_path / "home" / "results.db"
    deadline = time.monotonic() + 60
    ok_before: dict = {}
    engines_seen: list = []
    while time.monotonic() < deadline:
        if db.exists():
            with Store(db) as st:
                ok_before = (
                    {
                        (r.arm, r.load_key, r.repetition): r.started
                        for r in st.runs("intr")
                        if r.status == "ok"
                    }
                    if "intr" in st.experiment_names()
                    else {}
                )
        # one look at the engines per pass: with restart = "run" a run lasts ~0.3 s and a second
        # look could fall between two deployments (it did once in CI)
        engines_seen = live_procs(marker)
        if len(ok_before) >= 2 and engines_seen:
            break
        time.sleep(0.05)
    if not (ok_before and engines_seen):  # say what the runner was doing (seen once in CI)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        raise AssertionError(f"the run never got going: stored ok runs {sorted(ok_before)}, "
                             f"runner exit {proc.returncode}, output tail:\n{out[-3000:]}")
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert "interrupted" in out
    assert live_procs(marker) == [] and not any(
        os.path.exists(f"/proc/{p}") and p in live_procs(marker) for p in engines_seen
    )
    with Store(db) as st:
        stored = {
            (r.arm, r.load_key, r.repetition): r.started
            for r in st.runs("intr")
            if r.status == "ok"
        }
    assert 2 <= len(stored) < 8
    again = _servelab("run", str(f), env=env)
    out2, _ = again.communicate(timeout=120)
    assert again.returncode == 0, out2
    assert f"{len(stored)} of 8 runs already stored, {8 - len(stored)} to run" in out2
    with Store(db) as st:
        final = {
            (r.arm, r.load_key, r.repetition): r.started
            for r in st.runs("intr")
            if r.status == "ok"
        }
    assert len(final) == 8
    assert all(final[k] == v for k, v in stored.items())  # earlier runs were not redone
    assert live_procs(marker) == []


def test_detach_reports_progress_through_status(tmp_path, scripted, live_procs):
    text, marker = scripted("det", reps=1, loads="[2]", prompts=4)
    f = tmp_path / "det.toml"
    f.write_text(text)
    env = {**os.environ, "SERVELAB_HOME": str(tmp_path / "home"), "COLUMNS": "200"}
    out, _ = _servelab("run", str(f), "--detach", env=env).communicate(timeout=30)
    assert "runs in the background" in out and "servelab status det" in out
    deadline, status = time.monotonic() + 60, ""
    while time.monotonic() < deadline:
        status, _ = _servelab("status", "det", env=env).communicate(timeout=30)
        if "finished" in status:
            break
        time.sleep(0.5)
    assert "finished" in status and "2/2" in status, status
    assert "det.log" in status  # the job shows its log
    with Store(tmp_path / "home" / "results.db") as st:
        assert [r.status for r in st.runs("det")] == ["ok", "ok"]
    assert live_procs(marker) == []


def test_restart_block_keeps_all_arms_up_and_runs_them_back_to_back(
    tmp_path, scripted, live_procs, monkeypatch
):
    from servelab.experiment.deploy import deployment as deploy
    from servelab.experiment.run.measure import bench_measure

    # Teardown: the last launched stops first, and only the first launched (stopped last)
    # waits for GPU memory. Simulated nvidia-smi: 1000 MiB per live engine, +600 once a later
    # engine has launched beside it (engines grow while serving). A stop that waited with
    # another engine still up would see that growth and time out (seen on the H200: 120 s).
    events: list[tuple[str, int, bool]] = []
    live: dict[int, int] = {}
    real_start, real_stop = deploy.Deployment.start, deploy.Deployment.stop

    def start(self, *a, **k):
        events.append(("start", id(self), False))
        url = real_start(self, *a, **k)          # reads its baseline before it is live
        for i in live:
            live[i] = 1600
        live[id(self)] = 1000
        return url

    def stop(self, wait_gpu=True):
        events.append(("stop", id(self), wait_gpu))
        live.pop(id(self), None)
        real_stop(self, wait_gpu=wait_gpu)
        assert self.warning is None, self.warning

    monkeypatch.setattr(deploy, "gpu_memory_used_mib", lambda: [sum(live.values()), 0])
    monkeypatch.setattr(deploy.Deployment, "start", start)
    monkeypatch.setattr(deploy.Deployment, "stop", stop)

    text, marker = scripted("blk", reps=2, restart="block")
    f = tmp_path / "blk.toml"
    f.write_text(text.replace("[timeouts]\n", "[timeouts]\ngpu_free_s = 3\n"))
    spec = load(f)
    alive_during: list[int] = []

    def measure(url, spec, run):
        alive_during.append(len(live_procs(marker)))
        return bench_measure(url, spec, run)

    store = Store(tmp_path / "r.db")
    res = Runner(spec, store, measure=measure, say=lambda s: None).run()
    assert (res.ok, res.failed) == (8, 0)
    assert [(r.arm, r.load_key, r.block) for r in store.runs("blk")] == [
        ("slow", "c=1", 0),
        ("fast", "c=1", 0),
        ("fast", "c=4", 0),
        ("slow", "c=4", 0),
        ("fast", "c=1", 1),
        ("slow", "c=1", 1),
        ("slow", "c=4", 1),
        ("fast", "c=4", 1),
    ]
    # the first run of each block sees one engine (the other is launched on first use), then two
    assert alive_during == [1, 2, 2, 2, 1, 2, 2, 2]
    assert live_procs(marker) == []
    assert [k for k, _, _ in events] == ["start", "start", "stop", "stop"] * 2, events
    for blk in (events[:4], events[4:]):
        first, second = blk[0][1], blk[1][1]
        assert [(i, w) for _, i, w in blk[2:]] == [(second, False), (first, True)]


def test_external_engine_open_loop_shuffled(tmp_path):
    from servelab.bench.scripted.harness import serve_in_thread
    from servelab.bench.scripted.script import Script

    with serve_in_thread(Script(ttft_ms=5, gap_ms=2)) as srv:
        spec = parse(
            {
                "name": "ext",
                "engine": "external",
                "url": srv.url,
                "order": "shuffled",
                "seed": 3,
                "repetitions": 2,
                "arms": {"a": {}, "b": {}},
                "load": {"request_rate": [50.0]},
                "workload": {"input_len": 8, "output_len": 5, "num_prompts": 6},
            }
        )
        preflight(spec)
        store = Store(tmp_path / "r.db")
        res = Runner(spec, store, say=lambda s: None).run()
        n_server = len(srv.log())
    assert (res.ok, res.failed) == (4, 0)
    runs = store.runs("ext")
    assert {r.load_key for r in runs} == {"rate=50"}
    assert sum(store.load_point(r.load_point_id).summary["completed"] for r in runs) == 24
    assert n_server >= 24  # every request reached the server
    with pytest.raises(Exception, match="cannot change flags"):
        preflight(
            parse({**spec.to_json(), "arms": {"a": {}, "b": {"flags": {"x": 1}}}})
        )


def test_engines_die_with_a_runner_killed_by_sigkill(tmp_path, live_procs):
    """Even `kill -9` of the runner (no teardown possible) leaves no engine (PR_SET_PDEATHSIG)."""
    marker = f"k9-{os.getpid()}-{time.monotonic_ns()}"
    code = (
        "import sys, time\n"
        "from servelab import engines\n"
        "from servelab.engines.base import ProcessConfig\n"
        "from servelab.experiment.deploy.deployment import Deployment\n"
        "cmd = [sys.executable, '-m', 'servelab.bench.scripted', '--host', '{host}',"
        f" '--port', '{{port}}', '--model', sys.argv[1]]\n"
        "cfg = ProcessConfig(role='server', flags={}, extra={'command': cmd})\n"
        f"Deployment(engines.get('command'), '', [cfg], {str(tmp_path / 'logs')!r}).start()\n"
        "print('up', flush=True)\n"
        "time.sleep(120)\n"
    )
    runner = subprocess.Popen(
        [sys.executable, "-c", code, marker], stdout=subprocess.PIPE, text=True
    )
    assert runner.stdout.readline().strip() == "up"
    engines_up = [p for p in live_procs(marker) if p != runner.pid]
    assert len(engines_up) == 1
    runner.send_signal(signal.SIGKILL)
    runner.wait(timeout=30)
    deadline = time.monotonic() + 10
    while live_procs(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert live_procs(marker) == []


def test_a_second_runner_of_the_same_experiment_is_refused(tmp_path, scripted):
    from servelab.errors import UserError
    from servelab.jobs import Job

    text, _ = scripted("twice", reps=1, loads="[1]")
    f = tmp_path / "twice.toml"
    f.write_text(text)
    spec = load(f)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        job = Job("twice", "experiment", total=2)
        job.state.pid = sleeper.pid  # another live process runs it
        job.update()
        with pytest.raises(UserError, match=f"already running \\(pid {sleeper.pid}\\)"):
            Runner(spec, Store(tmp_path / "r.db"), say=lambda s: None).run()
    finally:
        sleeper.kill()
        sleeper.wait()
    res = Runner(spec, Store(tmp_path / "r.db"), say=lambda s: None).run()  # its pid is gone: fine
    assert res.ok == 2


def test_cli_run_twice_resumes_nothing_then_fresh_starts_over(tmp_path, scripted):
    from typer.testing import CliRunner

    from servelab.cli import app

    text, _ = scripted("cli", reps=1, loads="[1]", prompts=3)
    f = tmp_path / "cli.toml"
    f.write_text(text)
    db = tmp_path / "r.db"
    cli = CliRunner()
    first = cli.invoke(app, ["run", str(f), "--store", str(db)])
    assert first.exit_code == 0, first.output
    assert "experiment 'cli': 2 runs = 2 arms x 1 load points x 1 repetitions" in first.output
    assert "report: servelab report cli" in first.output
    again = cli.invoke(app, ["run", str(f), "--store", str(db)])
    assert "2 of 2 runs already stored, 0 to run" in again.output
    assert "noise band +-2%" in again.output
    f.write_text(text.replace("retries = 1\n", "retries = 1\nnoise_band = 0.5\n"))
    wider = cli.invoke(app, ["run", str(f), "--store", str(db)])  # the band may change on resume
    assert "2 of 2 runs already stored" in wider.output and "noise band +-50%" in wider.output
    with Store(db) as st:
        before = {r.id for r in st.runs("cli")}
    fresh = cli.invoke(app, ["run", str(f), "--store", str(db), "--fresh"])
    assert "forgot the stored runs of 'cli'" in fresh.output and "resuming" not in fresh.output
    with Store(db) as st:
        after = st.runs("cli")
    assert len(after) == 2 and not ({r.id for r in after} & before)


def test_runs_whose_requests_all_fail_are_stored_failed_with_the_reason(tmp_path, free_port):
    spec = parse(
        {
            "name": "down",
            "engine": "external",
            "url": f"http://127.0.0.1:{free_port}",  # nothing listens there
            "repetitions": 1,
            "arms": {"a": {}, "b": {}},
            "load": {"concurrency": [1]},
            "workload": {"input_len": 8, "output_len": 5, "num_prompts": 2},
        }
    )
    lines: list[str] = []
    res = Runner(spec, Store(tmp_path / "r.db"), say=lines.append).run()
    assert (res.ok, res.failed) == (0, 2)
    runs = Store(tmp_path / "r.db").runs("down")
    assert all(r.status == "failed" and "connect_error" in r.error for r in runs)
    assert sum("connect_error" in x for x in lines) == 2  # the console says why, not only 'failed'


def test_cli_exits_nonzero_when_no_run_succeeded(tmp_path, scripted, live_procs):
    """A script driving `servelab run` must see that nothing worked: every arm's engine dies at
    launch, each run is stored failed, and the command exits 1 (not 0)."""
    text, marker = scripted(
        "allbroken", reps=1, loads="[1]",
        arms="""
[arms.slow]
flags = { no-such-option = 1 }
[arms.fast]
flags = { no-such-option = 2 }
""",
    )
    f = tmp_path / "allbroken.toml"
    f.write_text(text)
    r = subprocess.run([sys.executable, "-m", "servelab", "run", str(f), "--store",
                        str(tmp_path / "r.db")], capture_output=True, text=True, timeout=180)
    assert r.returncode == 1, r.stdout + r.stderr
    with Store(tmp_path / "r.db") as st:
        assert {x.status for x in st.runs("allbroken")} == {"failed"}
    assert live_procs(marker) == []
