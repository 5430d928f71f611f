"""torch.profiler around engine steps, driven like SGLang's /start_profile and /stop_profile.

Commands arrive from the HTTP thread and are carried out by the engine thread (the profiler is
started, stepped and stopped where the model runs). Steps are annotated `step[DECODE bs=N]`,
`step[EXTEND bs=N]`, `step[TARGET_VERIFY bs=N]` as in SGLang, and the trace is written as
`{output_dir}/{time}-TP-0.trace.json.gz` (Chrome trace JSON, gzipped).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import torch


def step_name(new: int, running: int, speculative: bool) -> str:
    """The annotation of one engine step: EXTEND when it admits `new` requests (prefill), else
    TARGET_VERIFY (speculative decoding) or DECODE over the `running` ones."""
    if new:
        return f"step[EXTEND bs={new}]"
    return f"step[{'TARGET_VERIFY' if speculative else 'DECODE'} bs={running}]"


class StepProfiler:
    """One optional torch.profiler session, counting engine steps."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cmd: tuple[str, dict] | None = None
        self._done = threading.Event()
        self._result: dict = {}
        self._prof: torch.profiler.profile | None = None
        self._remaining: int | None = None
        self._out: Path | None = None

    @property
    def pending(self) -> bool:
        return self._cmd is not None

    def request(self, cmd: str, wake, timeout_s: float = 30.0, **kw) -> dict:
        """Ask the engine thread to 'start' or 'stop' (wake() rouses it); wait for its answer."""
        with self._lock:
            self._done.clear()
            self._cmd = (cmd, kw)
            wake()
            return self._result if self._done.wait(timeout_s) else {"error": "engine did not answer"}

    def poll(self) -> None:
        """Carry out a pending command (engine thread)."""
        if self._cmd is None:
            return
        cmd, kw = self._cmd
        self._cmd = None
        try:
            self._result = self._start(**kw) if cmd == "start" else self._stop_export()
        except Exception as exc:  # reported to the client, engine keeps serving
            self._result = {"error": f"{type(exc).__name__}: {exc}"}
        self._done.set()

    def _start(self, output_dir: str, num_steps: int | None, activities: list[str]) -> dict:
        if self._prof is not None:
            return {"error": "a profile is already running; POST /stop_profile first"}
        acts = [torch.profiler.ProfilerActivity.CPU]
        if "GPU" in activities and torch.cuda.is_available():
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        self._out, self._remaining = out, num_steps
        self._prof = torch.profiler.profile(activities=acts, record_shapes=False)
        self._prof.__enter__()
        return {"message": "profiling started", "output_dir": str(out), "num_steps": num_steps}

    def _stop_export(self) -> dict:
        if self._prof is None:
            return {"error": "no profile is running; POST /start_profile first"}
        prof, self._prof = self._prof, None
        prof.__exit__(None, None, None)
        path = self._out / f"{time.time():.0f}-TP-0.trace.json.gz"
        prof.export_chrome_trace(str(path))
        return {"message": "profile written", "trace": str(path)}

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Annotate one engine step; stop after num_steps when asked to."""
        if self._prof is None:
            yield
            return
        with torch.profiler.record_function(name):
            yield
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self._prof.step()
        if self._remaining is not None:
            self._remaining -= 1
            if self._remaining <= 0:
                self._stop_export()

    def stop(self) -> None:
        """Finish a running profile at shutdown (engine thread gone)."""
        if self._prof is not None:
            with contextlib.suppress(Exception):
                self._stop_export()
