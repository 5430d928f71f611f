"""Who runs tuning units: one process per GPU pulling from a shared queue, or Ray tasks.

A unit is one (N, K, M). The parent hands out units one at a time, largest first, to whichever
worker asks next (no fixed chunks, so no stragglers), attaching the measurements it already
has for that unit (resume) and the best configs of finished neighbouring batch sizes (warm
starts). Workers send back every measurement as it is made; only the parent writes files.
A worker that dies is restarted and its unit handed out again (twice at most); a config that
fails is a measurement with an error, never a crash.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from servelab import lifetime
from servelab.errors import UserError
from servelab.kernels.fp8_gemm import engine, formats
from servelab.kernels.fp8_gemm.configs import default_config, nearest
from servelab.tune import engine_space, engine_tune, search, space
from servelab.tune.compile import Precompiler
from servelab.tune.space import Config
from servelab.tune.timing import Measurement, Problem, warm_up_gpu

MAX_ATTEMPTS = 2
Emit = Callable[[dict[str, Any]], None]


@dataclass(frozen=True, slots=True)
class WorkSpec:
    """What every worker needs to run units (picklable)."""

    device: str               # "cuda" | "cpu"
    search: str
    space: str
    budget_frac: float
    ctx: str = ""
    compile_workers: int = 0  # processes per worker for compile-ahead (cuda); 0 = auto
    kernel: str = "servelab"  # whose launcher is timed: servelab | sglang | vllm
    margin: float = 0.015     # a tuned config must beat the shipped one by this much


@dataclass(frozen=True, slots=True)
class Assignment:
    """One unit handed to a worker with what the parent already knows about it."""

    n: int
    k: int
    m: int
    known: tuple[dict[str, Any], ...] = ()     # checkpointed measurement records
    hints: tuple[dict[str, int], ...] = ()     # engine dicts of neighbouring M's best configs


_PROC: dict[str, Any] = {}


def _prepare(spec: WorkSpec) -> None:
    if spec.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"


def probe(spec: WorkSpec) -> dict[str, Any]:
    """The device's name and software versions, from inside a worker."""
    _prepare(spec)
    import torch
    import triton
    if spec.device == "cuda":
        name = torch.cuda.get_device_name(torch.cuda.current_device())
    else:
        name = formats.CPU_DEVICE_NAME
    return {"device_name": name, "triton": triton.__version__, "torch": torch.__version__,
            "pid": os.getpid()}


def _precompiler(spec: WorkSpec):
    """Compile-ahead: servelab's kernel through compile.Precompiler (compile-only warmups,
    notes shared between workers); an engine's launcher through engine_tune.UnitCompiler
    (the engine's own launch on small inputs that specialise as the unit's)."""
    pc = _PROC.get("precompiler")
    if pc is None:
        n = spec.compile_workers or max(1, (os.cpu_count() or 2) // max(1, _PROC.get("ngpus", 1)) - 1)
        gpu = os.environ.get("CUDA_VISIBLE_DEVICES")
        on = spec.device == "cuda"
        if spec.kernel == "servelab":
            pc = Precompiler(spec.device, gpu, n if on else 0)
        else:
            pc = engine_tune.UnitCompiler(spec.kernel, n if on else 0)
        _PROC["precompiler"] = pc
    return pc


def engine_kernel(spec: WorkSpec):
    """The launcher timed by this worker (loaded once per process)."""
    ek = _PROC.get("kernel")
    if ek is None:
        ek = _PROC["kernel"] = engine.load(spec.kernel)
    return ek


def measurement_record(ctx: str, x) -> dict[str, Any]:
    return {"t": "m", "ctx": ctx, "n": x.n, "k": x.k, "m": x.m, "cfg_key": x.config.key,
            "cfg": x.config.as_engine(), "us": x.time_us, "spread": x.spread_us, "reps": x.reps,
            "err": x.error}


def run_unit(a: Assignment, spec: WorkSpec, emit: Emit) -> dict[str, Any]:
    """Search one (N, K, M); emits each new measurement; returns the unit record."""
    _prepare(spec)
    t0 = time.perf_counter()
    limits = space.device_limits() if spec.device == "cuda" else space.DeviceLimits()
    cands = space.candidates(a.n, a.k, a.m, spec.space, limits)
    ek = engine_kernel(spec)
    if spec.kernel != "servelab" and spec.device == "cuda":   # the engine's own tiles, and
        import torch  # SGLang's sm90 keys
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        extra = engine_space.stage1(a.n, a.k, a.m, props.multi_processor_count,
                                    props.major == 9 and "SPLIT_K" in ek.extra_keys, limits)
        cands = list(dict.fromkeys([*cands, *extra]))
    problem = Problem(a.n, a.k, a.m, spec.device, seed=a.n * 31 + a.k * 7 + a.m,
                      kernel=None if spec.kernel == "servelab" else ek)
    pc = _precompiler(spec)
    if hasattr(pc, "at"):                    # an engine launcher specialises per unit
        pc.at(a.n, a.k, a.m)
    if spec.device == "cuda" and not _PROC.get("warm"):
        warm_up_gpu()
        _PROC["warm"] = True
    cache: dict[Config, Measurement] = {}
    for r in a.known:
        c = Config.from_engine(r["cfg"])
        cache[c] = Measurement(a.n, a.k, a.m, c, r["us"], r.get("spread"), r["reps"], r.get("err"))
    reused = 0

    def measure(configs: list[Config], reps: int) -> list[Measurement]:
        nonlocal reused
        need = [c for c in configs if not (c in cache and (cache[c].time_us is None or cache[c].reps >= reps))]
        pc.submit(need)          # compile ahead in parallel while the first ones are timed;
        out = []                 # a failure there is re-tried at launch, which reports it
        for c in configs:
            old = cache.get(c)
            if old is not None and (old.time_us is None or old.reps >= reps):
                reused += 1
                out.append(old)
                continue
            pc.wait(c)
            x = problem.time(c, reps)
            cache[c] = x
            emit(measurement_record(spec.ctx, x))
            if x.error and spec.device == "cuda":
                _check_context()
            out.append(x)
        return out

    # the baseline is what the engine ships for this point (its file's nearest-M entry), or
    # its default where it ships none: always a finalist, and kept unless clearly beaten
    owner = spec.kernel if spec.kernel != "servelab" else "sglang"
    shipped = ek.shipped(a.n, a.k, probe(spec)["device_name"]) if spec.kernel != "servelab" else None
    default = Config.from_engine(nearest(shipped, a.m) if shipped else default_config(owner))
    hints = [Config.from_engine(h) for h in a.hints]
    res = search.run_search(spec.search, cands, measure, a.m, hints, spec.space, default,
                            seed=a.n * 1_000_003 + a.k * 1009 + a.m, budget_frac=spec.budget_frac)
    # the baseline (or its equivalent) was re-timed with the finalists: same clocks
    base = measure([search.equivalent_in(default, cands, a.m, spec.space) or default],
                   search.HIGH_REPS)[0]
    best, best_us = res.best, res.best_us
    if best is not None and best_us is not None and base.time_us is not None:
        best = engine_tune.choose({best: best_us, base.config: base.time_us}, base.config,
                                  spec.margin)
        best_us = best_us if best == res.best else base.time_us
    fails = [f"{x.config.key}: {x.error}" for x in cache.values() if x.error][:5]
    return {"t": "unit", "ctx": spec.ctx, "search": spec.search, "n": a.n, "k": a.k, "m": a.m,
            "best": best.as_engine() if best else None, "us": best_us,
            "default_us": base.time_us, "baseline": "shipped" if shipped else "default",
            "baseline_config": base.config.as_engine(), "kernel": ek.label,
            "timed": res.timed, "candidates": res.candidates,
            "failed": res.failed, "reused": reused, "fail_examples": fails,
            "seconds": time.perf_counter() - t0, "pid": os.getpid(),
            "compile_s": round(pc.seconds, 2), "compile_ahead": pc.status,
            "compiled": pc.compiled, "compile_skipped": pc.skipped}


def _check_context() -> None:
    """A config that broke the CUDA context (illegal access) ends the worker; the parent restarts it."""
    import torch
    try:
        torch.cuda.synchronize()
    except Exception:                        # noqa: BLE001
        pc = _PROC.get("precompiler")         # os._exit skips the worker's finally: end the
        if pc is not None:                    # compile processes (each holds a CUDA context)
            pc.close()
        os._exit(3)


# ---- local processes --------------------------------------------------------------------


def physical_gpu(gpu: str, visible: str | None) -> str:
    """`--gpus` ids count within an existing CUDA_VISIBLE_DEVICES, as CUDA's own ordinals do."""
    ids = [x.strip() for x in visible.split(",") if x.strip()] if visible else []
    if ids and gpu.isdigit() and int(gpu) < len(ids):
        return ids[int(gpu)]
    return gpu


def _maybe_fault(a: Assignment) -> None:
    """Fault injection for the tests: SERVELAB_TUNE_FAULT="N,K,M:MARKFILE" kills this worker
    the first time it is handed that unit (MARKFILE records that it happened)."""
    fault = os.environ.get("SERVELAB_TUNE_FAULT")
    if not fault:
        return
    unit, mark = fault.split(":", 1)
    if unit == f"{a.n},{a.k},{a.m}" and not os.path.exists(mark):
        with open(mark, "w") as f:
            f.write(str(os.getpid()))
        os._exit(3)


def _worker_main(slot: int, gpu: str, ngpus: int, spec: WorkSpec, inbox, outbox) -> None:
    if spec.device == "cuda":
        os.environ["CUDA_VISIBLE_DEVICES"] = physical_gpu(gpu, os.environ.get("CUDA_VISIBLE_DEVICES"))
    _PROC["ngpus"] = ngpus
    try:
        outbox.put({"t": "hello", "slot": slot, **probe(spec)})
        parent = os.getppid()
        while True:
            try:
                a = inbox.get(timeout=2.0)
            except queue.Empty:
                if os.getppid() != parent:   # the parent was killed: do not linger on the GPU
                    break
                continue
            if a is None:
                break
            _maybe_fault(a)
            rec = run_unit(a, spec, outbox.put)
            outbox.put({**rec, "slot": slot})
            outbox.put({"t": "ready", "slot": slot})
    except Exception:                        # noqa: BLE001 - reported to the parent, which restarts us
        outbox.put({"t": "crash", "slot": slot, "pid": os.getpid(),
                    "error": traceback.format_exc()[-2000:]})
    finally:
        pc = _PROC.get("precompiler")
        if pc is not None:
            pc.close()
        outbox.close()
        outbox.join_thread()               # every message reaches the parent, then leave at once:
        os._exit(0)                        # no atexit joins that could hang the job's end


class LocalPool:
    """One worker process per GPU (or per CPU slot with --device cpu)."""

    def __init__(self, spec: WorkSpec, gpus: list[str], log: Callable[[str], None]) -> None:
        self.spec, self.gpus, self.log = spec, gpus, log
        self.ctx = mp.get_context("spawn")
        self.outbox = self.ctx.Queue()
        self.procs: dict[int, Any] = {}
        self.inboxes: dict[int, Any] = {}
        self.restarts = 0
        self.stopping: set[int] = set()

    def _start(self, slot: int) -> None:
        self.inboxes[slot] = self.ctx.Queue()
        # not a daemon: daemonic processes may not start the compile pool's processes
        # run_tied: the worker dies with this process (it lived on 6-19 s after a kill -9)
        p = self.ctx.Process(target=lifetime.run_tied, daemon=False, args=(
            os.getpid(), _worker_main, slot, self.gpus[slot], len(self.gpus), self.spec,
            self.inboxes[slot], self.outbox))
        p.start()
        lifetime.guard(p.pid, group=False)  # and so do its compile workers
        self.procs[slot] = p

    def start(self) -> dict[str, Any]:
        """Start every worker; returns the first worker's probe (device name, versions)."""
        for slot in range(len(self.gpus)):
            self._start(slot)
        while True:
            msg = self._get(600)
            if msg.get("t") == "hello":
                self._pending_hello = [msg]
                return msg
            if msg.get("t") in ("crash", "dead"):
                self.close()
                raise RuntimeError(f"worker failed to start: {msg.get('error', 'process exited')}")

    def _get(self, timeout: float) -> dict[str, Any]:
        deadline = time.time() + timeout
        while True:
            try:
                return self.outbox.get(timeout=0.5)
            except queue.Empty:
                if time.time() > deadline:
                    raise TimeoutError("no message from any worker") from None
                dead = [s for s, p in self.procs.items()
                        if not p.is_alive() and s not in self.stopping]
                if dead:
                    return {"t": "dead", "slot": dead[0]}

    def run(self, next_unit: Callable[[], Assignment | None], handle: Emit) -> None:
        """Hand out units until `next_unit` returns None; `handle` gets every record."""
        busy: dict[int, Assignment] = {}
        attempts: dict[tuple[int, int, int], int] = {}
        idle: list[int] = [m["slot"] for m in getattr(self, "_pending_hello", [])]
        retry: list[Assignment] = []
        exhausted = False

        def dispatch(slot: int) -> None:
            nonlocal exhausted
            a = retry.pop(0) if retry else (None if exhausted else next_unit())
            if a is None:
                exhausted = True
                self.stopping.add(slot)
                self.inboxes[slot].put(None)
                return
            busy[slot] = a
            self.inboxes[slot].put(a)

        for s in idle:
            dispatch(s)
        while busy or retry or not exhausted:
            try:
                msg = self._get(3600)
            except TimeoutError:
                break
            t, slot = msg.get("t"), msg.get("slot")
            if t in ("hello", "ready"):
                busy.pop(slot, None)
                dispatch(slot)
            elif t == "unit":
                handle(msg)
            elif t == "m":
                handle(msg)
            elif t in ("crash", "dead"):
                p = self.procs.get(slot)
                if p is None or (t == "crash" and msg.get("pid") != p.pid):
                    continue                 # already handled as dead, or from a replaced process
                if p is not None:
                    p.join(timeout=5)
                a = busy.pop(slot, None)
                why = msg.get("error", f"exit code {p.exitcode if p else '?'}")
                self.log(f"worker {slot} (GPU {self.gpus[slot]}) died: {why.strip().splitlines()[-1]}")
                if a is not None:
                    key = (a.n, a.k, a.m)
                    attempts[key] = attempts.get(key, 0) + 1
                    if attempts[key] < MAX_ATTEMPTS:
                        retry.append(a)
                    else:
                        handle({"t": "fail", "ctx": self.spec.ctx, "n": a.n, "k": a.k, "m": a.m,
                                "error": why[-500:]})
                if (retry or not exhausted) and self.restarts < 3 * len(self.gpus):
                    self.restarts += 1
                    self._start(slot)
                else:
                    self.procs.pop(slot, None)
        self.close()

    def close(self) -> None:
        for slot, p in self.procs.items():
            if p.is_alive() and slot not in self.stopping:
                self.inboxes[slot].put(None)
        deadline = time.time() + 15
        for p in self.procs.values():
            p.join(timeout=max(0.1, deadline - time.time()))
            if p.is_alive():
                self.log(f"worker pid {p.pid} did not exit; terminating it")
                p.terminate()
                p.join(timeout=5)
        for q in [*self.inboxes.values(), self.outbox]:
            q.close()
            q.join_thread()
        self.procs.clear()


# ---- Ray ----------------------------------------------------------------------------------


def _ray_unit(a: Assignment, spec: WorkSpec) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    rec = run_unit(a, spec, out.append)
    out.append(rec)
    return out


class RayPool:
    """The same units as Ray tasks (num_gpus=1 each), at most one in flight per cluster GPU."""

    def __init__(self, spec: WorkSpec, address: str, log: Callable[[str], None]) -> None:
        self.spec, self.address, self.log = spec, address, log

    def start(self) -> dict[str, Any]:
        import ray
        if not ray.is_initialized():
            # "local" is Ray's own spelling for a new instance on this machine; no address
            # would join RAY_ADDRESS or the latest cluster started here (another user's)
            ray.init(address=self.address, include_dashboard=False, log_to_driver=False)
        self._ray = ray
        self._task = ray.remote(num_gpus=1, max_retries=MAX_ATTEMPTS - 1)(_ray_unit)
        self.slots = int(ray.cluster_resources().get("GPU", 0))
        if self.slots < 1:      # a num_gpus=1 task would wait forever for a GPU that never comes
            raise UserError(f"--ray {self.address}: the Ray cluster has no GPU (each unit is a "
                            "task with num_gpus=1); start Ray on GPU machines, or tune without "
                            "--ray")
        return ray.get(ray.remote(num_gpus=1)(probe).remote(self.spec))

    def run(self, next_unit: Callable[[], Assignment | None], handle: Emit) -> None:
        ray = self._ray
        inflight: dict[Any, Assignment] = {}
        while True:
            while len(inflight) < self.slots:
                a = next_unit()
                if a is None:
                    break
                inflight[self._task.remote(a, self.spec)] = a
            if not inflight:
                return
            ready, _ = ray.wait(list(inflight), num_returns=1)
            a = inflight.pop(ready[0])
            try:
                recs = ray.get(ready[0])
            except Exception as exc:          # noqa: BLE001 - the unit is given up, the job goes on
                handle({"t": "fail", "ctx": self.spec.ctx, "n": a.n, "k": a.k, "m": a.m,
                        "error": str(exc)[-500:]})
                continue
            for r in recs:
                handle(r)

    def close(self) -> None:
        pass
