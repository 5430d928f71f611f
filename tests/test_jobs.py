"""A second `--detach` of a job that is still running is refused (it said "started", exit 0,
and two copies raced over the same store rows and files)."""

from __future__ import annotations

import os

import pytest

from servelab import jobs
from servelab.errors import UserError


def test_detaching_a_running_job_again_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVELAB_HOME", str(tmp_path))
    job = jobs.Job("exp-a", "experiment", total=4)  # this process: alive, state running
    with pytest.raises(UserError, match="already running.*servelab status exp-a"):
        jobs.detach(["run", "exp.toml"], "exp-a")
    job.finish()
    pid, log = jobs.detach(["--version"], "exp-a")  # finished: a new run may start
    os.waitpid(pid, 0)
    assert "servelab" in log.read_text()


def test_appends_refuse_links_and_logs_are_private(tmp_path):
    """servelab writes logs only to files of its own: a planted link is an error, not a write
    elsewhere (issue: nothing touched outside its folder), and a new log is 0600."""
    import stat

    from servelab import atomic
    outside = tmp_path / "outside"
    outside.write_text("precious")
    link = tmp_path / "job.log"
    link.symlink_to(outside)
    with pytest.raises(OSError):
        atomic.open_append(link)
    assert outside.read_text() == "precious"
    with atomic.open_append(tmp_path / "new.log") as f:
        f.write(b"x")
    assert stat.S_IMODE((tmp_path / "new.log").stat().st_mode) == 0o600
