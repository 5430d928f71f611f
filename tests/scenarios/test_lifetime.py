"""Fault injection: kill -9 of the process that started engines or workers leaves no process
behind (children, grandchildren in the group, and grandchildren that left it with setsid), and
an experiment killed at random points resumes to exactly its planned runs, no duplicates.
Real processes, real signals; the engines are the bench's scripted server."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from servelab.jobs import pid_alive

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs Linux /proc")


def _with_marker(marker: str) -> list[int]:
    """Live processes whose command line holds `marker`."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                cmd = (d / "cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmd and pid_alive(int(d.name)):
                out.append(int(d.name))
    return out


def _wait_gone(marker: str, timeout: float) -> list[int]:
    deadline = time.time() + timeout
    left = _with_marker(marker)
    while left and time.time() < deadline:
        time.sleep(0.1)
        left = _with_marker(marker)
    return left


def _cleanup(marker: str) -> None:
    for p in _with_marker(marker):
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


# A child in its own session (as experiment/deploy/local.py starts engines) that starts one grandchild in its
# group and one that escapes it with setsid, as multi-process engines' workers may.
TREE = textwrap.dedent("""
    import os, subprocess, sys, time
    marker, guarded = sys.argv[1], sys.argv[2] == "1"
    from servelab import lifetime
    child = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys, time; m = sys.argv[1];"
         "nap = [sys.executable, '-c', 'import time; time.sleep(300)', m];"
         "subprocess.Popen(nap); subprocess.Popen(nap, start_new_session=True);"
         "time.sleep(300)", marker],
        start_new_session=True, preexec_fn=lifetime.die_with_parent)
    if guarded:
        lifetime.guard(child.pid)
    print("ready", flush=True)
    time.sleep(300)
""")


@pytest.mark.parametrize("guarded", [True, False])
def test_kill_9_of_the_starter_ends_the_whole_tree(guarded):
    """With the watchdog, child and both grandchildren die within the grace period; without it
    (the death signal alone, as before) the grandchildren are orphaned: the control case."""
    marker = f"tree-{uuid.uuid4().hex[:8]}"
    runner = subprocess.Popen([sys.executable, "-c", TREE, marker, "1" if guarded else "0"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert runner.stdout.readline().strip() == "ready"
        deadline = time.time() + 10
        while len(_with_marker(marker)) < 4 and time.time() < deadline:  # runner + child + 2
            time.sleep(0.05)
        assert len(_with_marker(marker)) == 4
        time.sleep(1.0)  # the watchdog records descendants twice a second
        runner.kill()
        runner.wait()
        left = _wait_gone(marker, 6.0 if guarded else 2.0)
        if guarded:
            assert left == [], f"orphans after kill -9: {left}"
        else:
            assert len(left) == 2  # the grandchildren: what the watchdog exists for
    finally:
        _cleanup(marker)


def _experiment(tmp_path: Path, marker: str) -> Path:
    """Two arms x two repetitions at one load point over a scripted server whose launch also
    leaves a setsid grandchild behind (a stand-in for an engine's GPU worker)."""
    boot = ("import os, subprocess, sys; subprocess.Popen([sys.executable, '-c', "
            f"'import time; time.sleep(300)', '{marker}'], "
            "start_new_session=True); os.execv(sys.executable, [sys.executable, '-m', "
            "'servelab.bench.scripted', *sys.argv[1:]])")
    f = tmp_path / "exp.toml"
    f.write_text(textwrap.dedent(f"""
        name = "kill9"
        hypothesis = "a killed runner leaves nothing and resumes"
        engine = "command"
        command = [{sys.executable!r}, "-c", {boot!r}, "--host", "{{host}}",
                   "--port", "{{port}}", "--model", "{marker}", "--no-log"]
        baseline = "slow"
        repetitions = 2
        restart = "arm"
        retries = 1

        [base.flags]
        ttft-ms = 5
        gap-ms = 4

        [arms.slow]
        [arms.fast]
        flags = {{ tokens-per-chunk = 2 }}

        [load]
        concurrency = [2]

        [workload]
        input_len = 8
        output_len = 9
        num_prompts = 8

        [timeouts]
        ready_s = 30
        teardown_s = 5
    """))
    return f


def test_kill_9_of_run_at_random_points_then_resume(tmp_path):
    """`servelab run` killed with -9 at two random moments: no engine or grandchild outlives
    it; the final run resumes to exactly the 4 planned runs, each stored once."""
    marker = f"run-{uuid.uuid4().hex[:8]}"
    exp, db = _experiment(tmp_path, marker), tmp_path / "r.db"
    env = {**os.environ, "SERVELAB_HOME": str(tmp_path / "home")}
    cmd = [sys.executable, "-m", "servelab", "run", str(exp), "--store", str(db)]
    rng = random.Random(20)
    try:
        for delay in (rng.uniform(0.0, 1.5) for _ in range(2)):
            p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
            deadline = time.time() + 60
            while not _with_marker(marker) and time.time() < deadline:
                time.sleep(0.05)  # an engine (and its grandchild) is up: the case that matters
            assert _with_marker(marker), "no engine started"
            time.sleep(delay)
            p.kill()
            p.wait()
            left = _wait_gone(marker, 6.0)
            assert left == [], f"kill -9 {delay:.1f} s into a deployment left {left}"
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        assert _wait_gone(marker, 6.0) == []
    finally:
        _cleanup(marker)
    con = sqlite3.connect(db)
    runs = con.execute("SELECT arm, load_key, repetition, status, load_point_id FROM runs "
                       "WHERE experiment = 'kill9'").fetchall()
    assert len(runs) == 4 and all(r[3] == "ok" for r in runs), runs
    assert len({r[:3] for r in runs}) == 4
    lp_ids = [r[4] for r in runs]
    assert len(set(lp_ids)) == 4  # each run points at its own load point, none shared
    con.close()


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d.name))
            except (OSError, IndexError, ValueError):
                pass
    return out


def test_kill_9_of_tune_ends_its_workers_at_once(tmp_path):
    """Tune workers lived 6-19 s after a kill -9 of `servelab tune`; now they die with it."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("CPU-interpreter tuning run; the GPU run is the same code path")
    out = tmp_path / "cfg"
    env = {**os.environ, "TRITON_INTERPRET": "1", "SERVELAB_HOME": str(tmp_path / "home")}
    p = subprocess.Popen([sys.executable, "-m", "servelab", "tune", "fp8-gemm", "--device", "cpu",
                          "--shape", "128,256", "--batch-sizes", "1,2,3,4,5,6,7,8", "--gpus",
                          "a,b", "--out", str(out), "--name", "k9"], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers: list[int] = []
    try:
        deadline = time.time() + 90
        while time.time() < deadline:  # both workers up (the watchdog is the third child)
            kids = [k for k in _children(p.pid) if b"lifetime" not in
                    Path(f"/proc/{k}/cmdline").read_bytes()]
            if len(kids) >= 2:
                workers = kids
                break
            time.sleep(0.1)
        assert len(workers) >= 2, "the workers did not start"
        time.sleep(1.0)
        p.kill()
        p.wait()
        t0 = time.time()
        while any(pid_alive(w) for w in workers) and time.time() - t0 < 10:
            time.sleep(0.05)
        alive = [w for w in workers if pid_alive(w)]
        assert not alive and time.time() - t0 < 3.0, (alive, time.time() - t0)
    finally:
        for w in workers:
            try:
                os.kill(w, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_kill_9_of_bench_leaves_a_consistent_store(tmp_path):
    """`servelab bench` killed at random moments: the store passes its integrity check, every
    stored load point's request file is there, and a new bench appends to it."""
    from servelab.bench.scripted.harness import serve_in_thread
    from servelab.bench.scripted.script import Script
    from servelab.store import Store

    db = tmp_path / "r.db"
    env = {**os.environ, "SERVELAB_HOME": str(tmp_path / "home")}
    rng = random.Random(7)
    with serve_in_thread(Script(ttft_ms=2, gap_ms=2)) as h:
        cmd = [sys.executable, "-m", "servelab", "bench", "--base-url", h.url, "--concurrency",
               "1,2,4,8", "--num-prompts", "6", "--input-len", "8", "--output-len", "8",
               "--quiet", "--store", str(db)]
        for delay in (rng.uniform(0.8, 2.5) for _ in range(2)):
            p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
            time.sleep(delay)
            p.kill()
            p.wait()
        with Store(db) as st:  # opening for writing runs the integrity check
            before = st.load_points()
            for lp in before:
                list(st.requests(lp))  # each file is whole (gzip written before the row)
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
    with Store(db) as st:
        assert len(st.load_points()) == len(before) + 4
