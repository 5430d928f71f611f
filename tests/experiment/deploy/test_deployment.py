"""Deployments (experiment/deploy/deployment.py): GPU memory back (a fake nvidia-smi), ports free
around launches, each process its own engine ports, and a process group killed at the ready
timeout."""

from __future__ import annotations

import os
import stat
import sys
import threading
import time

import pytest

from servelab import engines
from servelab.engines.base import ProcessConfig
from servelab.experiment.deploy import deployment as deploy
from servelab.experiment.deploy.deployment import Deployment


def test_stop_waits_until_gpu_memory_is_back(tmp_path, monkeypatch):
    mem = tmp_path / "used_mib"
    mem.write_text("1000\n2000\n")  # two GPUs before the launch
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\ncat {mem}\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    assert deploy.gpu_memory_used_mib() == [1000, 2000]

    cmd = [sys.executable, "-m", "servelab.bench.scripted", "--host", "{host}"]
    cfg = ProcessConfig(role="server", flags={}, extra={"command": cmd + ["--port", "{port}"]})
    dep = Deployment(engines.get("command"), "", [cfg], tmp_path / "logs", gpu_free_s=20)
    dep.start()
    mem.write_text("70000\n2100\n")  # the engine holds memory on GPU 0
    freed_at: list[float] = []

    def release() -> None:  # the driver frees it 1.5 s later
        time.sleep(1.5)
        mem.write_text("1300\n2100\n")  # within the 512 MiB slack
        freed_at.append(time.monotonic())

    threading.Thread(target=release, daemon=True).start()
    dep.stop()
    done = time.monotonic()
    assert freed_at and done >= freed_at[0]  # stop() returned only after the release
    assert done - freed_at[0] < 3.0  # and soon after it (1 s polling)


def test_memory_that_never_comes_back_is_reported(tmp_path, monkeypatch):
    mem = tmp_path / "used_mib"
    mem.write_text("1000\n")
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\ncat {mem}\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    cmd = [sys.executable, "-m", "servelab.bench.scripted", "--host", "{host}"]
    cfg = ProcessConfig(role="server", flags={}, extra={"command": cmd + ["--port", "{port}"]})
    dep = Deployment(engines.get("command"), "", [cfg], tmp_path / "logs", gpu_free_s=1.0)
    dep.start()
    mem.write_text("9000\n")  # leaked by something
    t0 = time.monotonic()
    dep.stop()
    assert 1.0 <= time.monotonic() - t0 < 4.0
    assert dep.warning and "MiB now [9000], before launch [1000]" in dep.warning


def test_a_busy_fixed_port_blocks_the_launch(tmp_path, live_procs):
    import socket

    import pytest

    from servelab.experiment.deploy.base import DeployError

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        marker = f"busy-{port}-{time.monotonic_ns()}"
        cmd = [sys.executable, "-m", "servelab.bench.scripted", "--model", marker]
        cfg = ProcessConfig(
            role="server", flags={}, port=port, extra={"command": cmd + ["--port", "{port}"]}
        )
        dep = Deployment(engines.get("command"), "", [cfg], tmp_path / "logs", port_free_s=0.5)
        with pytest.raises(DeployError, match=f"port {port} of the server process is still in use"):
            dep.start()
        assert live_procs(marker) == []  # nothing was launched onto the busy port


def test_each_process_gets_its_own_engine_ports_and_a_set_one_is_kept(tmp_path):
    # SGLang 0.5.23 binds --engine-info-bootstrap-port (default 6789) and --nccl-port in every
    # server: two on one node collided before ports were allocated per process
    procs = [ProcessConfig(role="prefill", flags={"nccl-port": 12345}),
             ProcessConfig(role="decode", flags={}),
             ProcessConfig(role="router", flags={})]
    dep = Deployment(engines.get("sglang"), "m", procs, tmp_path)
    plans = dep.plan()

    def val(argv: list[str], flag: str) -> int:
        return int(argv[argv.index(flag) + 1])

    pre, dec, rtr = (p.argv for p in plans)
    assert val(pre, "--nccl-port") == 12345                       # the file's own is kept
    ports = [val(a, f) for a in (pre, dec) for f in
             ("--port", "--nccl-port", "--engine-info-bootstrap-port")]
    boot = val(pre, "--disaggregation-bootstrap-port")
    assert len(set([*ports, boot, val(rtr, "--port")])) == 8
    assert "--disaggregation-bootstrap-port" not in dec
    assert rtr[rtr.index("--prefill") + 2] == str(boot)          # the router is told it


def test_deployment_ready_timeout_kills_the_process_group(tmp_path, live_procs):
    from servelab.engines import get
    from servelab.engines.base import ProcessConfig
    from servelab.experiment.deploy.base import DeployError
    from servelab.experiment.deploy.deployment import Deployment

    marker = f"hang-{os.getpid()}-{time.monotonic_ns()}"
    script = (
        f"import subprocess, sys, time; print('booting {marker}', flush=True); "
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', '{marker}']); "
        "time.sleep(60)"
    )
    cfg = ProcessConfig(
        role="server", flags={}, extra={"command": [sys.executable, "-c", script, marker]}
    )
    dep = Deployment(get("command"), "", [cfg], tmp_path / "logs", ready_timeout_s=1.5, grace_s=2)
    with pytest.raises(DeployError) as ei:
        dep.start()
    assert "not ready after 2 s" in str(ei.value) or "not ready after 1 s" in str(ei.value)
    assert f"booting {marker}" in ei.value.log_tail
    assert live_procs(marker) == []  # the child of the child too
