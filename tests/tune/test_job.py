"""The whole tuning pipeline on the CPU (Triton interpreter, tiny space): detach, status,
kill mid-run, resume, two worker processes, Ray, verify, CLI errors."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from interpreter import interpreter_or_skip

from servelab import jobs
from servelab.errors import UserError
from servelab.kernels.fp8_gemm import formats
from servelab.tune import checkpoint
from servelab.tune import verify as V

DEV = "Triton_interpreter_CPU"


def _cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "servelab", *args], capture_output=True, text=True,
                          timeout=timeout)


def _units(out: Path) -> list[dict]:
    return [r for r in checkpoint.read_records(out / checkpoint.FILE_NAME) if r and r["t"] == "unit"]


def test_detach_kill_mid_run_then_resume(tmp_path):
    out = tmp_path / "cfg"
    base = ["tune", "fp8-gemm", "--device", "cpu", "--shape", "128,256", "--batch-sizes",
            "1,2,3,4,5,6", "--out", str(out), "--name", "t1"]
    r = _cli(*base, "--detach", timeout=60)
    assert r.returncode == 0, r.stderr
    pid = int(re.search(r"pid (\d+)", r.stdout).group(1))
    deadline = time.time() + 150
    while time.time() < deadline:
        st = jobs.read_all("t1")
        if st and st[0].done >= 2:
            break
        time.sleep(0.2)
    else:
        os.killpg(pid, signal.SIGKILL)
        pytest.fail("detached job made no progress")
    os.killpg(pid, signal.SIGKILL)                  # kill the job and its workers mid-run
    while jobs._alive(pid):
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            time.sleep(0.05)
    assert jobs.read_all("t1")[0].state == "dead"
    sg = out / formats.config_file_name("sglang", 128, 256, DEV)
    before = formats.read_config_file(sg)
    done_before = {u["m"] for u in _units(out)}
    assert len(before) >= 2 and set(before) <= done_before

    r = _cli(*base, "--gpus", "a,b")                 # same command, two worker processes
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"resuming from .*: (\d+)/6 units already done", r.stdout)
    assert m and int(m.group(1)) == len(done_before), r.stdout
    after = formats.read_config_file(sg)
    assert sorted(after) == [1, 2, 3, 4, 5, 6]
    assert {k: after[k] for k in before} == before                    # finished units kept
    assert formats.read_config_file(out / formats.config_file_name("vllm", 128, 256, DEV)) == after
    per_m = [u["m"] for u in _units(out)]
    assert sorted(per_m) == [1, 2, 3, 4, 5, 6]                        # none re-tuned
    assert len({u["pid"] for u in _units(out) if u["m"] not in done_before}) >= 1
    side = json.loads((out / formats.side_file_name(128, 256, DEV)).read_text())
    assert side["timings_meaningless"] is True and "MEANINGLESS" in side["timing_method"]
    assert sorted(map(int, side["points"])) == [1, 2, 3, 4, 5, 6]
    st = _cli("status", "t1", timeout=60)
    assert "finished" in st.stdout and "6/6" in st.stdout, st.stdout
    r = _cli(*base, "--json")  # all from the checkpoint: the result as one document on stdout
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "servelab.tune/1" and doc["resumed_points"] == 6
    assert [p["m"] for p in doc["points"]] == [1, 2, 3, 4, 5, 6] and doc["failed"] == []
    assert {(p["m"], json.dumps(p["config"], sort_keys=True)) for p in doc["points"]} == {
        (m, json.dumps(c, sort_keys=True)) for m, c in after.items()
    }
    assert str(sg) in doc["files"] and "done: 6 points tuned" in r.stderr


def test_ray_backend_runs_units_as_tasks(tmp_path):
    ray = pytest.importorskip("ray")
    from servelab.tune import job
    ray.init(address="local", num_cpus=1, num_gpus=1, include_dashboard=False,
             log_to_driver=False)                # its own instance, not one running here
    try:
        spec = job.TuneSpec(shapes=((128, 128),), out_dir=tmp_path, batch_sizes=(1, 3),
                            device="cpu", ray="local", name="ray1")
        rep = job.run(spec, echo=lambda s: None)
    finally:
        ray.shutdown()
    assert sorted(m for (_, _, m) in rep.units) == [1, 3]
    assert all(u["pid"] != os.getpid() for u in rep.units.values())   # ran in Ray workers
    entries = formats.read_config_file(tmp_path / formats.config_file_name("sglang", 128, 128, DEV))
    assert sorted(entries) == [1, 3]


def test_verify_times_tuned_against_default_and_checks_files(tmp_path, monkeypatch):
    # verify(device="cpu") / Problem(..., "cpu") interpret the fp8 GEMM kernel module, which
    # then stays interpreted for the process (tests/lib/interpreter.py).
    interpreter_or_skip("tests/tune/test_job.py", module_level=False)
    # verify(device="cpu") sets TRITON_INTERPRET for the process (the CLI's way); set it
    # through monkeypatch first so that the variable is restored after this test.
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    tuned = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
             "num_warps": 4, "num_stages": 2}
    formats.merge_write_config(tmp_path / formats.config_file_name("sglang", 128, 256, DEV),
                               {1: tuned, 64: dict(tuned, BLOCK_SIZE_M=32)})
    shipped = tmp_path / "engine-configs"        # what the engine ships for this shape
    shipped.mkdir()
    formats.merge_write_config(shipped / formats.config_file_name("sglang", 128, 256, DEV),
                               {4: dict(tuned, BLOCK_SIZE_N=32, SPLIT_K=2)})
    checks, rows, here, label = V.verify(tmp_path, "cpu", (2,), kernel="servelab",
                                         shipped_dir=shipped)
    assert here == DEV and len(checks) == 1 and checks[0].batch_sizes == (1, 64)
    assert 2 in checks[0].missing_default and 1 not in checks[0].missing_default
    assert [(r.n, r.k, r.m, r.tuned) for r in rows] == [(128, 256, 2, "m16n64k128g1w4s2")]
    assert rows[0].speedup is not None and rows[0].speedup > 0
    assert rows[0].shipped == "m16n32k128g1w4s2sk2" and rows[0].shipped_us is not None
    assert rows[0].vs_shipped is not None and "servelab" in label
    (tmp_path / formats.config_file_name("vllm", 128, 256, DEV)).write_text("{}")
    with pytest.raises(UserError, match="malformed"):
        V.check_dir(tmp_path)
    with pytest.raises(UserError, match="no SGLang/vLLM"):
        V.check_dir(_empty(tmp_path))


def _empty(tmp_path: Path) -> Path:
    d = tmp_path / "empty"
    d.mkdir()
    return d


def test_cli_bad_shape_is_one_line_error():
    r = _cli("tune", "fp8-gemm", "--shape", "4096", "--device", "cpu", timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["error: --shape '4096': expected N,K, e.g. --shape 4096,512"]


def test_a_worker_crash_costs_one_unit_retry_not_the_job(tmp_path, monkeypatch):
    from servelab.tune import job
    mark = tmp_path / "crashed"
    monkeypatch.setenv("SERVELAB_TUNE_FAULT", f"128,128,2:{mark}")
    msgs: list[str] = []
    spec = job.TuneSpec(shapes=((128, 128),), out_dir=tmp_path / "o", batch_sizes=(1, 2, 3),
                        device="cpu", gpus=("a",), name="crash1")
    rep = job.run(spec, echo=msgs.append)
    crashed_pid = int(mark.read_text())
    assert any("died" in m for m in msgs), msgs
    assert sorted(m for (_, _, m) in rep.units) == [1, 2, 3] and not rep.failed
    assert rep.units[(128, 128, 2)]["pid"] != crashed_pid            # redone by the new worker


def test_a_failing_config_is_noted_not_fatal(monkeypatch):
    # verify(device="cpu") / Problem(..., "cpu") interpret the fp8 GEMM kernel module, which
    # then stays interpreted for the process (tests/lib/interpreter.py).
    interpreter_or_skip("tests/tune/test_job.py", module_level=False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from servelab.tune.space import Config
    from servelab.tune.timing import Problem
    p = Problem(128, 128, 2, "cpu")
    bad = p.time(Config(16, 48, 64, 1, 4, 2), 1)
    good = p.time(Config(16, 32, 64, 1, 4, 2), 1)
    assert bad.time_us is None and "power of two" in bad.error
    assert good.time_us is not None and good.error is None


def test_gpu_ids_count_within_cuda_visible_devices():
    from servelab.tune.workers import physical_gpu
    assert physical_gpu("1", "4,5,6") == "5"
    assert physical_gpu("0", None) == "0"
    assert physical_gpu("1", "") == "1"
    assert physical_gpu("GPU-abc", "4,5") == "GPU-abc"
