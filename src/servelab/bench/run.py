"""One load point end to end: server info, workload, warmup, load, /metrics before and after,
records and summary; and saving it to the store. This is the library entry point that
`servelab bench` and the experiment runner both call.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import hashlib
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import aiohttp

from servelab import provenance
from servelab.bench import spec_metrics
from servelab.bench.client import Client, RawResult, get_json, get_text
from servelab.bench.config import BenchConfig, LoadPoint, WorkloadConfig
from servelab.bench.datasets import build_workload
from servelab.bench.datasets.text import local_counter
from servelab.bench.load import (
    arrival_offsets_s,
    closed_loop,
    largest_burst,
    open_connections,
    open_loop,
    replay_offsets_s,
)
from servelab.bench.metrics import first_token_ms, make_record, stats, summarize
from servelab.bench.sessions import run_sessions
from servelab.bench.warmup import (
    SteadyRun,
    metrics_marks,
    queue_probe,
    steady_fields,
    steady_open_loop,
    steady_verdict,
)
from servelab.bench.workload import CountFn, Workload
from servelab.errors import UserError
from servelab.telemetry.point import PointTelemetry, Sent
from servelab.telemetry.steady import Online

_WORKLOADS: dict[tuple[Any, ...], Workload] = {}  # built once per (server, workload, load point)


def prompt_seed(seed: int, load_key: str) -> int:
    """The prompts' seed for one load point: derived from (seed, load point), so load points
    measured on one server lifetime never replay each other's prompts (a prefix cache, on by
    default in SGLang and vLLM, would turn the later TTFTs into cache hits), while every arm and
    repetition at the same load point gets the same prompts."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{load_key}".encode()).digest()[:4], "big")


@dataclass(repr=False)
class LoadPointResult:
    """The outcome of one load point: `summary` (docs/METRICS.md), per-request `records` (dicts),
    and what the server said about itself (`/v1/models`, `/server_info` or `/get_server_info`)."""

    summary: dict[str, Any]
    records: list[dict[str, Any]] = field(default_factory=list)
    server_info: dict[str, Any] = field(default_factory=dict)
    telemetry: dict[str, Any] | None = None  # the series over the load (telemetry/point.py)

    def __repr__(self) -> str:  # asyncio reprs finished tasks' results: keep it short
        s = self.summary
        return (f"LoadPointResult({s.get('load_key')}, completed={s.get('completed')}, "
                f"failed={s.get('failed')}, records={len(self.records)})")


class _Progress:
    """Rich live progress (requests done, output tok/s, errors) on stderr; silent when off."""

    def __init__(self, enabled: bool, total: int, label: str) -> None:
        self.enabled = enabled
        self.done = self.failed = self.tokens = 0
        self.t0 = time.perf_counter()
        if not enabled:
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.p = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                          TextColumn("{task.fields[tok_s]} tok/s  errors {task.fields[errors]}"),
                          TimeElapsedColumn(), console=Console(stderr=True), transient=True,
                          refresh_per_second=4)
        self.task = self.p.add_task(label, total=total, tok_s="-", errors=0)
        self.p.start()

    def __call__(self, r: RawResult) -> None:
        self.done += 1
        if r.error:
            self.failed += 1
        elif r.completion_tokens is not None:
            self.tokens += r.completion_tokens
        else:
            self.tokens += len(r.events)
        if self.enabled:
            el = time.perf_counter() - self.t0
            self.p.update(self.task, completed=self.done, errors=self.failed,
                          tok_s=f"{self.tokens / el:,.0f}" if el > 0 else "-")

    def close(self) -> None:
        if self.enabled:
            self.p.stop()


async def _server_info(session: aiohttp.ClientSession, root: str) -> dict[str, Any]:
    """`/v1/models` and the server's description of itself: SGLang's `/server_info` first,
    `/get_server_info` (deprecated by SGLang for it, the only one before) as the fallback; the
    key says which answered."""
    models, info = await asyncio.gather(get_json(session, root + "/v1/models"),
                                        get_json(session, root + "/server_info"))
    out: dict[str, Any] = {}
    if models is not None:
        out["v1_models"] = models
    if info is not None:
        out["server_info"] = info
    else:
        legacy = await get_json(session, root + "/get_server_info")
        if legacy is not None:
            out["get_server_info"] = legacy
    return out


def _model_from(info: dict[str, Any]) -> str | None:
    try:
        return info["v1_models"]["data"][0]["id"]
    except (KeyError, IndexError, TypeError):
        return None


async def _remote_counter(session: aiohttp.ClientSession, root: str, model: str | None) -> CountFn | None:
    """A token counter backed by the server's /tokenize, if it answers with a count."""

    def body(text: str) -> dict[str, Any]:
        return {"prompt": text, **({"model": model} if model else {})}

    async def count(text: str) -> int:
        ans = await get_json(session, root + "/tokenize", method="POST", body=body(text),
                             timeout_s=30)
        if not isinstance(ans, dict):
            raise RuntimeError("/tokenize stopped answering")
        n = ans.get("count")
        return int(n) if isinstance(n, int) else len(ans.get("tokens") or [])

    probe = await get_json(session, root + "/tokenize", method="POST", body=body("hello world"))
    if isinstance(probe, dict) and (isinstance(probe.get("count"), int) or isinstance(probe.get("tokens"), list)):
        return count
    return None


_WARNED: set[str] = set()


def _warn_once(line: str) -> None:
    if line not in _WARNED:
        _WARNED.add(line)
        print(line, file=sys.stderr)


def request_auth(cfg: BenchConfig) -> dict[str, str] | None:
    """The Authorization header requests carry. An API key (SERVELAB_API_KEY, else
    OPENAI_API_KEY) goes as a bearer token, what SGLang's and vLLM's --api-key check.
    Credentials in --base-url (`http://user:pw@host`, e.g. a proxy in front) go as HTTP basic
    auth. A request carries one Authorization header, so when both are given the API key wins
    and the URL's credentials are not sent (a warning says so)."""
    key = os.environ.get("SERVELAB_API_KEY") or os.environ.get("OPENAI_API_KEY")
    if key:
        if cfg.basic_auth is not None:
            _warn_once(f"warning: --base-url {cfg.shown_url} carries credentials and an API key "
                       "is set: the API key is sent as the bearer token, the URL's are not")
        return {"Authorization": f"Bearer {key}"}
    if cfg.basic_auth is not None:
        pair = ":".join(cfg.basic_auth).encode()
        return {"Authorization": f"Basic {base64.b64encode(pair).decode()}"}
    return None


def steady_mode(cfg: BenchConfig, load: LoadPoint) -> bool:
    """Whether this load point warms up until steady (`cfg.warmup_until_steady`): open-loop
    points at a finite rate of single requests; the others run as before (a sweep's
    synchronous and saturated points)."""
    r = load.request_rate
    return (cfg.warmup_until_steady and r is not None and math.isfinite(r)
            and cfg.workload.sessions is None)


async def _run(cfg: BenchConfig, load: LoadPoint, progress: bool) -> LoadPointResult:
    root = cfg.root_url
    conn = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
    steady = steady_mode(cfg, load)
    # the warm-up pool of a steady point: as many prompts again, reused cyclically
    extra = cfg.workload.num_prompts if steady else cfg.warmup
    auth = request_auth(cfg)  # the requests' and the scraper's Authorization header
    async with aiohttp.ClientSession(connector=conn, headers=auth) as session:
        info = await _server_info(session, root)
        model = cfg.model or _model_from(info)
        remote = await _remote_counter(session, root, model)
        wcfg = replace(cfg.workload, seed=prompt_seed(cfg.workload.seed, load.key))
        wl_key = (root, wcfg, extra, remote is not None, model)
        wl = _WORKLOADS.get(wl_key)
        if wl is None:
            try:
                wl = await build_workload(wcfg, extra, remote)
            except RuntimeError as exc:  # /tokenize died half way: count locally or approximate
                wl = await build_workload(wcfg, extra, None)
                info["tokenize_error"] = str(exc)
            _WORKLOADS[wl_key] = wl
            while len(_WORKLOADS) > 8:  # an experiment restarts servers on new ports: stay small
                _WORKLOADS.pop(next(iter(_WORKLOADS)))
        count = local_counter(cfg.workload.tokenizer) if cfg.workload.tokenizer else None
        client = Client(session, root, cfg.api, model, cfg.request_timeout_s)

        if load.replay and not wl.timed:
            raise UserError(f"load point 'replay' sends each request at its own time, but the "
                            f"{cfg.workload.kind} dataset has none: use --dataset-name trace, or "
                            "give --concurrency / --request-rate")
        if wl.warmup and not steady:
            conc = load.concurrency or min(len(wl.warmup), 8)
            await closed_loop(wl.warmup, conc, lambda s: client.send(s, warmup=True))

        offs = None
        if load.concurrency is None:  # open loop: the schedule, and connections for its bursts
            burst = 8  # a steady point's schedule is drawn as it goes
            if not steady:
                offs = (replay_offsets_s(wl.requests) if load.replay else arrival_offsets_s(
                    len(wl.requests), load.request_rate, load.burstiness, cfg.workload.seed))
                burst = min(largest_burst(offs), 512)
            await open_connections(session, root + "/v1/models", burst)
        tel = (PointTelemetry(root + "/metrics", cfg.scrape_interval_s, headers=auth).start()
               if cfg.scrape_interval_s > 0 else None)
        before = spec_metrics.parse_prometheus(await get_text(session, root + "/metrics"))
        prog = _Progress(progress, len(wl.requests), load.key)
        cpu0 = time.process_time()
        t0 = time.perf_counter_ns()
        deadline = t0 + int(cfg.max_duration_s * 1e9) if cfg.max_duration_s else None
        try:
            raws, sent, srun = await _drive(cfg, load, wl, client, session, tel, deadline, prog,
                                            offs)
        except BaseException:
            if tel is not None:
                tel.stop()
            raise
        finally:
            prog.close()
        cpu_s, loop_s = time.process_time() - cpu0, (time.perf_counter_ns() - t0) / 1e9
        t_end = max((r.t_end_ns for r in raws), default=time.perf_counter_ns())
        after = spec_metrics.parse_prometheus(await get_text(session, root + "/metrics"))

    specs = {s.index: s for s in (sent or wl.requests)}
    raws.sort(key=lambda r: r.t_start_ns)
    t_first = raws[0].t_start_ns if raws else t0
    recs = [make_record(r, specs[r.index], t_first, count) for r in raws]
    # no request sent (--max-duration over before the first): no duration, so no rates
    summary = summarize(recs, (t_end - t_first) / 1e9 if raws else 0.0, cfg.goodput or None)
    scraped = bool(before or after)
    if srun is not None:  # a steady point: the counters over its measured span alone
        before, after = (srun.span_metrics.get(k, {}) for k in ("start", "end"))
    summary.update(spec_metrics.acceptance(recs, before, after))
    summary.update({
        "load_key": load.key, "concurrency": load.concurrency, "request_rate": load.request_rate,
        "burstiness": load.burstiness if load.request_rate is not None else None,
        "api": cfg.api, "model": model, "base_url": cfg.shown_url,
        "num_prompts": cfg.workload.num_prompts, "issued": len(raws),
        "warmup": srun.warmup_requests if srun else len(wl.warmup),
        # (a session's failed turn also leaves its later turns unsent: not the duration)
        "stopped_by_duration": deadline is not None and len(raws) < len(wl.requests),
        "input_len_exact": wl.input_len_exact, "input_len_source": wl.input_len_source,
        "input_len": cfg.workload.input_len if cfg.workload.kind == "random" else None,
        "output_len": cfg.workload.output_len if cfg.workload.kind == "random" else None,
        "dataset": cfg.workload.dataset, "dataset_name": cfg.workload.kind,
        "seed": cfg.workload.seed, **(wl.info or {}),
        "metrics_scraped": scraped,
        # the client's own CPU time over the load (all threads of this process); near
        # duration_s means the client, not the server, may be the bottleneck (a steady
        # point's over its whole loop, warm-up and cool-down included, so over the loop's time)
        "client_cpu_s": cpu_s,
        "client_cpu_util": cpu_s / loop_s if srun is not None and loop_s > 0 else
        cpu_s / summary["duration_s"] if summary["duration_s"] else None,
        **steady_fields(srun),
    })
    series = await _telemetry(tel, raws, recs, t_end, summary,
                              srun.background if srun else (),
                              srun.window_start_ns if srun else None, srun is not None)
    if srun is not None:
        steady_verdict(srun, summary)
    return LoadPointResult(summary=summary, records=[r.to_dict() for r in recs], server_info=info,
                           telemetry=series)


async def _drive(cfg: BenchConfig, load: LoadPoint, wl: Workload, client: Client,
                 session: aiohttp.ClientSession, tel: PointTelemetry | None,
                 deadline: int | None, prog: _Progress, offs: Sequence[float] | None
                 ) -> tuple[list[RawResult], list[Any] | None, SteadyRun | None]:
    """Send the load point's requests: (results, the specs as sent when sessions built them,
    the steady run when the point warmed up until steady); `offs` an open loop's schedule."""
    if cfg.workload.sessions is not None:  # multi-turn: each turn carries its history
        raws, sent = await run_sessions(wl.requests, load, cfg.api == "chat", client.send,
                                        cfg.workload.sessions.think_time, cfg.workload.seed,
                                        deadline, prog)
        return raws, sent, None
    if load.concurrency is not None:
        return await closed_loop(wl.requests, load.concurrency, client.send, deadline,
                                 prog), None, None
    assert load.request_rate is not None or load.replay
    if steady_mode(cfg, load):
        assert load.request_rate is not None
        t0 = time.perf_counter_ns()
        detector = Online(min_window_s=cfg.steady_window_s, queue=queue_probe(tel, t0))
        marks: dict[str, dict[str, float]] = {}
        srun = await steady_open_loop(
            wl.requests, wl.warmup, load.request_rate, load.burstiness, cfg.workload.seed,
            client.send, detector, first_token_ms, cfg.max_warmup_s, deadline, prog, t0_ns=t0,
            span_hook=metrics_marks(lambda: get_text(session, cfg.root_url + "/metrics"), marks))
        srun.span_metrics = marks
        return srun.measured, None, srun
    assert offs is not None
    return await open_loop(wl.requests, offs, client.send, deadline, prog), None, None


async def _telemetry(tel: PointTelemetry | None, raws: list[RawResult], recs: list[Any],
                     t_end_ns: int, summary: dict[str, Any],
                     background: Sequence[RawResult] = (), span_start_ns: int | None = None,
                     measured_span: bool = False) -> dict[str, Any] | None:
    """Stop the load point's telemetry, add its summary fields to `summary` and return the
    series to store beside the records (None, and the fields None, when it was off)."""
    if tel is None:
        summary.update({"telemetry": None, "steadiness": None, "above_saturation": None,
                        "max_queued_requests": None, "energy": None, "j_per_output_token": None,
                        "output_tokens_per_j": None, "throttle_reasons": None,
                        "steady_window": None})
        return None
    sent = [Sent(r.t_start_ns, r.t_end_ns, rec.ttft_ms) for r, rec in zip(raws, recs, strict=True)]
    # a steady point's warm-up and cool-down requests: in the steadiness test (from where
    # its warm-up's steady window began), never in the statistics
    bg = [Sent(r.t_start_ns, r.t_end_ns, first_token_ms(r)) for r in background]
    series, fields = await asyncio.to_thread(tel.finish, sent, t_end_ns,
                                             summary.get("total_output_tokens"), bg,
                                             span_start_ns, measured_span)
    summary.update(fields)
    # the latencies of the requests sent inside the steady span: the warm-up and the drain
    # left out (null unless the point was steady)
    st, win = fields.get("steadiness") or {}, None
    if st.get("status") == "steady":
        a, b = st["warmup_end_s"], st["drain_start_s"]
        inside = [rec for r, rec in zip(raws, recs, strict=True)
                  if a <= tel.to_series_s(r.t_start_ns) <= b]
        done = [x for x in inside if x.ok]
        win = {"start_s": a, "end_s": b, "requests": len(inside), "completed": len(done),
               **{k: stats(getattr(x, k) for x in done) for k in ("ttft_ms", "tpot_ms", "e2e_ms")}}
    summary["steady_window"] = win
    return series


def run_load_point(cfg: BenchConfig, load: LoadPoint, *, progress: bool = True) -> LoadPointResult:
    """Measure one load point against `cfg.base_url`. Synchronous (runs its own event loop; from
    inside a running loop it runs on a worker thread). Failed requests are counted, never raised;
    UserError only for an unusable configuration."""
    if not isinstance(cfg, BenchConfig) or not isinstance(load, LoadPoint):
        raise UserError("run_load_point needs a BenchConfig and a LoadPoint")
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run_interruptible(_run(cfg, load, progress))
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        return ex.submit(asyncio.run, _run(cfg, load, progress)).result()


def run_interruptible(coro: Any, grace_s: float = 5.0) -> Any:
    """`asyncio.run(coro)`, with Ctrl-C raised as KeyboardInterrupt at once and a bounded
    teardown. asyncio.run turns the first Ctrl-C into a cancellation of the main task and raises
    KeyboardInterrupt only if that task ends cancelled: when code under it absorbs the
    cancellation, the Ctrl-C is lost and the load point runs on (tests/bench/test_run.py
    shows it); and its teardown waits for every task however long it
    takes. Here the tasks get `grace_s` to end once cancelled, and are then abandoned."""
    import signal
    import threading

    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        return asyncio.run(coro)

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    loop = asyncio.new_event_loop()
    signal.signal(signal.SIGINT, interrupt)
    try:
        main = loop.create_task(coro)
        try:
            return loop.run_until_complete(main)
        except KeyboardInterrupt:
            signal.signal(signal.SIGINT, signal.default_int_handler)  # a 2nd Ctrl-C: at once
            pending = asyncio.all_tasks(loop)
            for t in pending:
                t.cancel()
            if pending:
                loop.run_until_complete(asyncio.wait(pending, timeout=grace_s))
            raise
        finally:
            if not asyncio.all_tasks(loop):
                loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        loop.close()


def save_load_point(store: Any, cfg: BenchConfig, load: LoadPoint, result: LoadPointResult, *,
                    source: str = "bench", label: str | None = None) -> int:
    """Write the load point (summary, provenance, per-request records) to the store; its id."""
    prov = provenance.collect(
        server_info=result.server_info,
        bench_config={"base_url": cfg.shown_url, "model": cfg.model, "api": cfg.api,
                      "warmup": cfg.warmup, "max_duration_s": cfg.max_duration_s,
                      "request_timeout_s": cfg.request_timeout_s, "goodput": dict(cfg.goodput)},
        workload=asdict(cfg.workload), workload_seed=cfg.workload.seed,
        load={"concurrency": load.concurrency, "request_rate": load.request_rate,
              "burstiness": load.burstiness},
    )
    return store.add_load_point(
        summary=result.summary, provenance=prov, load_key=load.key, source=source, label=label,
        base_url=cfg.shown_url, model=result.summary.get("model") or cfg.model,
        concurrency=load.concurrency, request_rate=load.request_rate, requests=result.records,
        telemetry=result.telemetry,
    )


__all__ = ["LoadPointResult", "WorkloadConfig", "run_load_point", "save_load_point"]
