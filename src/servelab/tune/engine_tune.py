"""Tune the engine's own block-FP8 launcher (kernels/fp8_gemm/engine.py) on the GPU at hand.

Per (N, K, M) point, in stages over all points at once so compiling is parallel:
  1. coarse: engine_space.stage1 (tile x split x swap), compiled ahead on the CPU cores, timed
     at low fidelity;
  2. refine: local moves around the best three (stages, warps, GROUP_SIZE_M, split);
  3. final: the best four and the config the engine SHIPS for this point (its file's
     nearest-M entry, or its default) re-timed back to back at high fidelity. The shipped
     config is replaced only when the winner beats it by more than `margin`, so a tuned file
     is never slower than what the engine ships beyond the timing noise.
A deadline bounds the search: stage 1 stops at 55% of it, stage 2 at 80%; the final stage
always runs (five configs per point) and compares whatever was timed.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from servelab.tune import engine_space, search
from servelab.tune.space import Config, device_limits
from servelab.tune.timing import Measurement, Problem

Echo = Callable[[str], None]
_CHILD: dict[str, Any] = {}


@dataclass(frozen=True, slots=True)
class Point:
    n: int
    k: int
    m: int


@dataclass
class PointResult:
    """The outcome of one point: the chosen config and the evidence."""

    point: Point
    shipped: Config
    shipped_source: str            # "file" (the engine's file for this shape) or "default"
    best: Config
    best_us: float | None = None
    shipped_us: float | None = None
    tuned: bool = False            # False: the deadline came first, the shipped config is kept
    timed: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)


def _child_init(kernel: str, extra_path: str) -> None:
    if extra_path:
        import sys
        sys.path[:0] = extra_path.split(os.pathsep)
    from servelab.kernels.fp8_gemm import engine
    _CHILD["ek"] = engine.load(kernel)


def _child_compile(cfg: dict[str, Any], m: int, n: int, k: int) -> str | None:
    """Launch once on small inputs that specialise as the real ones (same M and N; K with the
    same divisibility of K/128 by 16), so the binaries land in Triton's on-disk cache."""
    import torch

    from servelab.kernels.fp8_gemm import reference as R
    try:
        a = torch.zeros((m, k), device="cuda").to(R.FP8_DTYPE)
        b = torch.zeros((n, k), device="cuda").to(R.FP8_DTYPE)
        a_s = torch.ones((m, k // 128), device="cuda")
        b_s = torch.ones((-(-n // 128), k // 128), device="cuda")
        _CHILD["ek"].launch(a, a_s, b, b_s, cfg)
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - reported; the config is skipped
        return f"{type(exc).__name__}: {str(exc).strip()[:200]}"
    return None


def _compile_k(k: int) -> int:
    """A small K whose K/128 has the same divisibility by 16 as the real K's (Triton
    specialises integer arguments such as the scale strides on it)."""
    return 2048 if (k // 128) % 16 == 0 else 512


def _task_key(c: Config, p: Point) -> tuple[Any, ...]:
    mclass = 1 if p.m == 1 else (16 if p.m % 16 == 0 else 0)
    # the split-K reduction is specialised on M*N (a constexpr in SGLang's launcher)
    return (c, mclass, _compile_k(p.k), p.m * p.n if c.split_k > 1 else None)


class Compiler:
    """A spawn-context process pool compiling (config, point) variants ahead of timing: all of
    a stage is submitted at once, and each point is timed as soon as its variants are in
    Triton's cache (compiling overlaps timing; only the low-fidelity stages see that)."""

    def __init__(self, kernel: str, workers: int) -> None:
        self.kernel, self.workers = kernel, workers
        self._pool: cf.ProcessPoolExecutor | None = None
        self._futs: dict[tuple[Any, ...], cf.Future] = {}
        self.errors: dict[tuple[Any, ...], str] = {}
        self.broken: str | None = None

    def submit(self, todo: Sequence[tuple[Config, Point]]) -> None:
        """Queue every variant not queued yet, in order; returns at once."""
        if self.workers <= 0 or self.broken:
            return
        if self._pool is None:
            extra = os.environ.get("PYTHONPATH", "")
            self._pool = cf.ProcessPoolExecutor(self.workers, mp_context=mp.get_context("spawn"),
                                                initializer=_child_init,
                                                initargs=(self.kernel, extra))
        for c, p in todo:
            key = _task_key(c, p)
            if key not in self._futs:
                self._futs[key] = self._pool.submit(_child_compile, c.as_engine(), p.m, p.n,
                                                    _compile_k(p.k))

    def wait(self, todo: Sequence[tuple[Config, Point]], until: float) -> None:
        """Wait (until `until` at most) for these variants; a broken pool means the timing
        process compiles on first launch from now on."""
        for c, p in todo:
            fut = self._futs.get(_task_key(c, p))
            if fut is None or self.broken:
                continue
            try:
                err = fut.result(timeout=max(0.0, until - time.time()))
            except cf.TimeoutError:
                return
            except Exception as exc:  # noqa: BLE001 - BrokenProcessPool and the like
                self.broken = f"{type(exc).__name__}: {exc}"[:200]
                return
            if err:
                self.errors[_task_key(c, p)] = err

    def failed(self, c: Config, p: Point) -> str | None:
        return self.errors.get(_task_key(c, p))

    def close(self) -> None:
        """Stop the pool without waiting on it; its processes are ours, ended by pid."""
        if self._pool is not None:
            procs = list(getattr(self._pool, "_processes", {}).values())
            self._pool.shutdown(wait=False, cancel_futures=True)
            for proc in procs:
                if proc.is_alive():
                    proc.terminate()
            self._pool = None


class UnitCompiler:
    """compile.Precompiler's interface (submit / wait / close and its counters) over a
    `Compiler` for an engine's launcher, for `servelab tune fp8-gemm --kernel sglang|vllm`:
    the worker points it at the unit being tuned (`at`), submits that unit's candidates at
    once and times each as soon as it is in Triton's cache, instead of compiling one config
    at a time on first launch."""

    def __init__(self, kernel: str, workers: int) -> None:
        self._comp = Compiler(kernel, workers)
        self._point = Point(0, 0, 0)
        self._submitted: set[tuple[Any, ...]] = set()
        self.seconds = 0.0
        self.compiled = 0
        self.skipped = 0
        self.status = f"on: {workers} processes ({kernel} launcher)" if workers > 0 else "off"

    def at(self, n: int, k: int, m: int) -> None:
        self._point = Point(n, k, m)

    def submit(self, configs: Sequence[Config]) -> None:
        """Queue these configs for the current unit; a variant already compiled for an
        earlier unit of this worker (same specialisation) counts as skipped."""
        todo = [(c, self._point) for c in configs]
        new = {_task_key(c, p) for c, p in todo} - self._submitted
        self.skipped += len({_task_key(c, p) for c, p in todo}) - len(new)
        if self._comp.workers > 0 and not self._comp.broken:
            self.compiled += len(new)
        self._submitted |= new
        self._comp.submit(todo)

    def wait(self, c: Config) -> str | None:
        """Block until `c` is compiled for the current unit; its compile error, if any."""
        t0 = time.perf_counter()
        self._comp.wait([(c, self._point)], time.time() + 600.0)
        self.seconds += time.perf_counter() - t0
        if self._comp.broken:
            self.status = f"off: {self._comp.broken}"
        return self._comp.failed(c, self._point)

    def close(self) -> None:
        self._comp.close()


FINAL_ROUNDS = 3


def alternate(prob: Problem, configs: Sequence[Config], reps: int,
              rounds: int) -> list[float | None]:
    """Median time of each config (by position: a config listed twice is timed twice) over
    `rounds` passes, the order reversed every other pass (ABC CBA ...): on the H200 the first
    of two identical configs timed back to back read up to 2% slower at 1.5 ms per call
    (2026-12-01), a position bias the alternation cancels. None: the config failed."""
    import statistics
    got: list[list[float]] = [[] for _ in configs]
    failed: set[int] = set()
    order = list(range(len(configs)))
    for i in range(rounds):
        for j in (order if i % 2 == 0 else order[::-1]):
            if j in failed:
                continue
            x = prob.time(configs[j], reps)
            if x.time_us is None:
                failed.add(j)
            else:
                got[j].append(x.time_us)
    return [statistics.median(v) if v and j not in failed else None for j, v in enumerate(got)]


def choose(times_us: dict[Config, float], shipped: Config, margin: float) -> Config:
    """The fastest config, unless it beats the shipped one by no more than `margin` (or the
    shipped one failed: then the fastest): a tuned file replaces what
    the engine ships only where the gain is beyond timing noise."""
    if not times_us:
        return shipped
    best = min(times_us, key=times_us.__getitem__)
    base = times_us.get(shipped)
    if base is not None and times_us[best] > base * (1 - margin):
        return shipped
    return best


def tune(ek: Any, points: Sequence[Point], shipped: Callable[[Point], tuple[Config, str]],
         deadline_s: float, compile_workers: int = 0, margin: float = 0.015,
         echo: Echo = print) -> list[PointResult]:
    """Tune every point (see the module docstring); `shipped(point)` gives the engine's
    config for it and where that came from."""
    import torch
    t0 = time.time()
    t_end = t0 + deadline_s
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    # split-K / swapped operands only where the launcher reads them (SGLang on sm90)
    sms, hopper = props.multi_processor_count, props.major == 9 and "SPLIT_K" in ek.extra_keys
    lim = device_limits()
    comp = Compiler(ek.engine, compile_workers)
    probs: dict[Point, Problem] = {}
    results = {p: PointResult(p, *shipped(p), best=shipped(p)[0]) for p in points}
    timed: dict[Point, dict[Config, Measurement]] = {p: {} for p in points}

    def problem(p: Point) -> Problem:
        if p not in probs:
            probs.clear()                                  # one point's inputs at a time
            torch.cuda.empty_cache()
            probs[p] = Problem(p.n, p.k, p.m, "cuda", seed=p.n + p.k + p.m, kernel=ek)
        return probs[p]

    def measure(p: Point, cands: list[Config], reps: int, until: float) -> None:
        r = results[p]
        for c in cands:
            if c in timed[p] or time.time() > until:
                continue
            err = comp.failed(c, p)
            x = (Measurement(p.n, p.k, p.m, c, None, None, 0, err) if err
                 else problem(p).time(c, reps))
            timed[p][c] = x
            r.timed += 1
            if x.time_us is None:
                r.failed += 1
                if len(r.errors) < 3:
                    r.errors.append(f"{c.key}: {x.error}")

    def stage(name: str, cands_of: Callable[[Point], list[Config]], reps: int,
              until: float) -> None:
        """Compile then time every point's candidates; what is not timed by `until` is
        skipped (the final stage still compares what was)."""
        t1 = time.time()
        todo = {p: [c for c in cands_of(p) if c not in timed[p]] for p in points}
        comp.submit([(c, p) for p, cs in todo.items() for c in cs])
        done = 0
        for p in points:
            comp.wait([(c, p) for c in todo[p]], until)
            measure(p, todo[p], reps, until)
            done += all(c in timed[p] for c in todo[p])
        echo(f"{name}: {sum(map(len, todo.values()))} candidates, {done}/{len(points)} points "
             f"complete in {time.time() - t1:.0f} s, {max(0.0, t_end - time.time()):.0f} s left"
             + (f"; compile pool broke: {comp.broken}" if comp.broken else ""))

    try:
        stage("stage 1 (coarse)", lambda p: [results[p].shipped, *engine_space.stage1(
            p.n, p.k, p.m, sms, hopper, lim)], search.LOW_REPS, t0 + 0.55 * deadline_s)

        def around_best(p: Point) -> list[Config]:
            ranked = sorted((x for x in timed[p].values() if x.time_us is not None),
                            key=lambda x: x.time_us)[:3]
            out: dict[Config, None] = {}
            for x in ranked:
                out.update(dict.fromkeys(engine_space.refine(x.config, p.n, p.k, p.m, sms,
                                                             hopper, lim)))
            return list(out)

        stage("stage 2 (refine)", around_best, search.LOW_REPS, t0 + 0.8 * deadline_s)
        for p in points:                       # the final stage always runs: it is short
            r = results[p]
            ranked = sorted((x for x in timed[p].values() if x.time_us is not None),
                            key=lambda x: x.time_us)[: search.FINALISTS]
            finalists = list(dict.fromkeys([r.shipped, *(x.config for x in ranked)]))
            final = dict(zip(finalists, alternate(problem(p), finalists, search.HIGH_REPS,
                                                  FINAL_ROUNDS), strict=True))
            ok = {c: us for c, us in final.items() if us is not None}
            r.shipped_us = ok.get(r.shipped)
            r.best = choose(ok, r.shipped, margin)
            r.best_us, r.tuned = ok.get(r.best), True
    finally:
        comp.close()
    return [results[p] for p in points]
