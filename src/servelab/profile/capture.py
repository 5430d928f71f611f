"""`servelab profile capture`: ask a running SGLang-style server for a trace of N forward steps.

SGLang (and the embedded engine) take `POST /start_profile` with `{"output_dir", "num_steps",
"activities": ["CPU", "GPU"]}`, profile the next `num_steps` forward passes and write
`{profile_id}-TP-{rank}.trace.json.gz` into `output_dir` (on the server's machine: run this on
the same host, or point `--out` at a shared path). Decode steps only happen under load, so the
capture can drive `--load N` streaming completions while it waits for the files.

A capture that ends without its trace (timeout, Ctrl-C, SIGTERM, a failed load) stops the
server's profile with `POST /stop_profile`: left running, the server would refuse the next
capture ("a profile is already running").
"""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from servelab.errors import UserError

TRACE_GLOBS = ("*.trace.json.gz", "*.trace.json", "*.pt.trace.json.gz", "*.pt.trace.json")


@dataclass(frozen=True, slots=True)
class CaptureConfig:
    """One capture: where, how many steps, how much load, how long to wait."""

    url: str
    num_steps: int
    out_dir: Path
    load: int = 0  # concurrent requests kept in flight while profiling
    max_tokens: int = 64
    model: str | None = None
    timeout_s: float = 120.0

    def __post_init__(self) -> None:
        u = urlsplit(self.url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise UserError(f"--url {self.url!r} is not a server URL; give its root, e.g. "
                            "http://127.0.0.1:30000")
        for name, v, lo, hi in (("--num-steps", self.num_steps, 1, 100_000),
                                ("--load", self.load, 0, 1024),
                                ("--max-tokens", self.max_tokens, 1, 1 << 20)):
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise UserError(f"{name} must be an integer in [{lo}, {hi}], got {v}")
        if not (isinstance(self.timeout_s, int | float) and 0 < self.timeout_s <= 86_400):
            raise UserError(f"--timeout must be in (0, 86400] seconds, got {self.timeout_s}")


def _post(url: str, body: dict, timeout: float) -> tuple[int, str]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as exc:
        raise UserError(f"cannot reach {url}: {exc}; is the server running?") from None


def _existing(out: Path) -> set[Path]:
    return {p for g in TRACE_GLOBS for p in out.glob(g)}


def _load_worker(cfg: CaptureConfig, stop: threading.Event, errors: list[str]) -> None:
    body = {"prompt": "Profile me: count slowly from one to one hundred.", "max_tokens": cfg.max_tokens,
            "temperature": 0.0, "ignore_eos": True}
    if cfg.model:
        body["model"] = cfg.model
    while not stop.is_set():
        try:
            status, text = _post(cfg.url.rstrip("/") + "/v1/completions", body, timeout=cfg.timeout_s)
        except UserError as exc:
            errors.append(str(exc))
            return
        if status >= 400:
            errors.append(f"/v1/completions answered {status}: {text[:200]}")
            return


def _raise_interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def capture(cfg: CaptureConfig) -> list[Path]:
    """Start the server's profiler, keep `load` requests in flight, return the new trace files.
    However the wait ends without them, the server's profile is stopped."""
    try:
        cfg.out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--out {cfg.out_dir}: cannot create it ({exc.strerror})") from None
    out = cfg.out_dir.resolve()
    before = _existing(out)
    status, text = _post(
        cfg.url.rstrip("/") + "/start_profile",
        {"output_dir": str(out), "num_steps": cfg.num_steps, "activities": ["CPU", "GPU"]},
        timeout=30.0,
    )
    if status >= 400:
        raise UserError(
            f"{cfg.url}/start_profile answered {status}: {text[:200]} (SGLang needs "
            "SGLANG_TORCH_PROFILER_DIR or output_dir; the embedded engine needs a GPU build)"
        )
    stop = threading.Event()
    errors: list[str] = []
    workers = [
        threading.Thread(target=_load_worker, args=(cfg, stop, errors), daemon=True)
        for _ in range(cfg.load)
    ]
    for w in workers:
        w.start()
    deadline = time.monotonic() + cfg.timeout_s
    found: list[Path] = []
    # SIGTERM (a runner's teardown, `timeout`) unwinds like Ctrl-C, through the finally below
    old = (signal.signal(signal.SIGTERM, _raise_interrupt)
           if threading.current_thread() is threading.main_thread() else None)
    try:
        while time.monotonic() < deadline:
            new = sorted(_existing(out) - before)
            if new and _stable(new):
                found = new
                break
            if errors and not any(w.is_alive() for w in workers):
                raise UserError(f"load requests failed while profiling: {errors[0]}")
            time.sleep(0.2)
    finally:
        stop.set()
        if old is not None:
            signal.signal(signal.SIGTERM, old)
        if not found:
            _stop_profile(cfg.url)
    if not found:
        raise UserError(
            f"no trace file appeared in {out} within {cfg.timeout_s:.0f} s; the server profiles "
            f"only forward steps: send load (--load N) and check that {out} is on the server's host"
        )
    return found


def _stop_profile(url: str) -> None:
    """Best effort: the server answers 400 when its profile already ended; either is fine."""
    try:
        _post(url.rstrip("/") + "/stop_profile", {}, timeout=10.0)
    except UserError:
        pass


def _stable(paths: list[Path]) -> bool:
    """True once the files stopped growing (the server finished writing them)."""
    sizes = [p.stat().st_size for p in paths]
    time.sleep(0.3)
    return all(s > 0 for s in sizes) and sizes == [p.stat().st_size for p in paths]
