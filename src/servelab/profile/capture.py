"""`servelab profile capture`: ask a running SGLang-style server for a trace of N forward steps.

SGLang (and the embedded engine) take `POST /start_profile` with `{"output_dir", "num_steps",
"activities": ["CPU", "GPU"]}`, profile the next `num_steps` forward passes and write
`{profile_id}-TP-{rank}.trace.json.gz` into `output_dir` (on the server's machine: run this on
the same host, or point `--out` at a shared path). Decode steps only happen under load, so the
capture can drive `--load N` streaming completions while it waits for the files.

Steady state by default (issue 32: a capture right after start-up recorded two compile/capture
EXTEND steps that filled 90-98% of the window). The load starts first; the capture reads the
server's `/metrics` (`sglang:num_running_reqs` / `vllm:num_requests_running`, the queue, and
`vllm:generation_tokens_total`) until the requested batch runs with nothing queued and
`--warmup-steps` decode steps at that batch went by, and only then starts the profile. With
`--phase decode` (the default) the load requests are made long enough that none ends (and no new
one is admitted, an EXTEND step) inside the window; with `--phase extend` they ask for one token,
so that the steps are prefills; `--phase any` keeps `--max-tokens`. `--include-warmup` starts the
profile before the load, as before. A server without `/metrics` gets `--settle` seconds instead,
and the capture says so. The window's make-up (steps per phase and their batch sizes) is read
back from the trace and printed.

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
from typing import Any
from urllib.parse import urlsplit

from servelab.errors import UserError

PHASES = ("decode", "extend", "any")
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
    phase: str = "decode"  # decode | extend | any: what the window should hold
    include_warmup: bool = False  # start the profile before the load (the old behaviour)
    warmup_steps: int = 8  # decode steps at the full batch before the profile starts
    settle_s: float = 5.0  # wait when the server has no /metrics to watch

    @property
    def request_tokens(self) -> int:
        """Tokens per load request: decode windows need requests that outlast them (each decode
        step adds one token per request; x4 and +256 cover the steps run while the profile
        request travels and starts)."""
        if self.include_warmup or self.phase == "any":
            return self.max_tokens
        if self.phase == "extend":
            return 1
        return max(self.max_tokens, 4 * (self.warmup_steps + self.num_steps) + 256)

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
        if self.phase not in PHASES:
            raise UserError(f"--phase {self.phase!r}: choose one of {', '.join(PHASES)}")
        if not 0 <= self.warmup_steps <= 100_000:
            raise UserError(f"--warmup-steps must be in [0, 100000], got {self.warmup_steps}")


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
    """Keep one completion in flight until `stop`. Streamed, so that closing the stream when the
    capture ends aborts a long request on the server (SGLang and the embedded engine free the
    slot when the client goes away) instead of leaving it to run out its tokens."""
    body = {"prompt": "Profile me: count slowly from one to one hundred.",
            "max_tokens": cfg.request_tokens, "temperature": 0.0, "ignore_eos": True,
            "stream": True}
    if cfg.model:
        body["model"] = cfg.model
    url = cfg.url.rstrip("/") + "/v1/completions"
    while not stop.is_set():
        req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=cfg.timeout_s) as r:
                while not stop.is_set() and r.readline():
                    pass
        except urllib.error.HTTPError as exc:
            errors.append(f"/v1/completions answered {exc.code}: "
                          f"{exc.read().decode(errors='replace')[:200]}")
            return
        except (urllib.error.URLError, OSError) as exc:
            if not stop.is_set():
                errors.append(f"cannot reach {url}: {exc}; is the server running?")
            return


def _raise_interrupt(*_: object) -> None:
    raise KeyboardInterrupt


_SERIES = {"running": ("sglang:num_running_reqs", "vllm:num_requests_running"),
           "waiting": ("sglang:num_queue_reqs", "vllm:num_requests_waiting"),
           "generated": ("vllm:generation_tokens_total", "sglang:generation_tokens_total")}


def read_metrics(url: str) -> dict[str, float] | None:
    """running, waiting and generated tokens from the server's Prometheus `/metrics` (None when
    it has none, or none of these series)."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=5.0) as r:
            text = r.read().decode(errors="replace")
    except (urllib.error.URLError, OSError):
        return None
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        for key, names in _SERIES.items():
            if name in names:
                try:
                    out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
                except (ValueError, IndexError):
                    pass
    return out if {"running", "waiting"} <= set(out) else None


def wait_steady(cfg: CaptureConfig, deadline: float, errors: list[str]) -> str:
    """Block until the server runs `load` requests with none queued and `warmup_steps` decode
    steps at that batch went by (`--phase extend`/`any`: until it generated `warmup_steps` x
    load tokens, whatever its batch: one-token requests never fill one); return how the wait
    ended (for the make-up line)."""
    if cfg.load == 0:
        return "no load: the window holds whatever the server runs"
    need_full = cfg.phase == "decode"
    start_gen: float | None = None
    while time.monotonic() < deadline:
        if errors:
            raise UserError(f"load requests failed before profiling: {errors[0]}")
        m = read_metrics(cfg.url)
        if m is None:
            time.sleep(min(cfg.settle_s, max(deadline - time.monotonic(), 0)))
            return (f"the server has no /metrics to watch: waited {cfg.settle_s:g} s after "
                    "starting the load")
        full = m["running"] >= cfg.load and m["waiting"] == 0
        if (need_full and not full) or "generated" not in m:
            start_gen = None
        elif start_gen is None:
            start_gen = m["generated"]
        elif m["generated"] - start_gen >= cfg.warmup_steps * cfg.load:
            if need_full:
                return (f"started after {cfg.warmup_steps} decode steps at batch {cfg.load} "
                        "with nothing queued")
            return (f"started after {cfg.warmup_steps * cfg.load} tokens of load "
                    f"(--phase {cfg.phase})")
        time.sleep(0.02)
    raise UserError(f"the server did not reach batch {cfg.load} with nothing queued within "
                    f"{cfg.timeout_s:.0f} s (its /metrics: running, waiting); lower --load or "
                    "raise --timeout")


def capture(cfg: CaptureConfig) -> tuple[list[Path], str]:
    """Start the load, wait for steady state (unless `include_warmup`), profile `num_steps`
    steps; return the new trace files and how the window was started. However the wait ends
    without them, the server's profile is stopped."""
    try:
        cfg.out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--out {cfg.out_dir}: cannot create it ({exc.strerror})") from None
    out = cfg.out_dir.resolve()
    before = _existing(out)
    stop = threading.Event()
    errors: list[str] = []
    workers = [threading.Thread(target=_load_worker, args=(cfg, stop, errors), daemon=True)
               for _ in range(cfg.load)]
    deadline = time.monotonic() + cfg.timeout_s
    found: list[Path] = []
    how = "--include-warmup: the profile started before the load"
    # SIGTERM (a runner's teardown, `timeout`) unwinds like Ctrl-C, through the finally below
    old = (signal.signal(signal.SIGTERM, _raise_interrupt)
           if threading.current_thread() is threading.main_thread() else None)
    try:
        if cfg.include_warmup:
            _start_profile(cfg, out)
        for w in workers:
            w.start()
        if not cfg.include_warmup:
            how = wait_steady(cfg, deadline, errors)
            _start_profile(cfg, out)
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
    return found, how


def _start_profile(cfg: CaptureConfig, out: Path) -> None:
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


def window_makeup(path: Path) -> dict[str, dict[str, Any]]:
    """Steps per phase in a trace and their batch sizes, read from its step annotations only
    (so a CPU trace without GPU events has a make-up too)."""
    from servelab.profile.steps import step_annotations
    from servelab.profile.trace import read_trace

    out: dict[str, dict[str, Any]] = {}
    for phase, bs in step_annotations(read_trace(path)):
        row = out.setdefault(phase or "STEP", {"n_steps": 0, "batch_sizes": {}})
        row["n_steps"] += 1
        if bs is not None:
            row["batch_sizes"][bs] = row["batch_sizes"].get(bs, 0) + 1
    return out


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
