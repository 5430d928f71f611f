"""Run an experiment: deploy each arm, measure each load point, store every run as it finishes.

Resume is by the store: runs already stored as 'ok' are skipped, failed ones are retried. A
launch that fails is retried `retries` times; then its runs are recorded failed with the log tail
and the experiment goes on. Ctrl-C (or SIGTERM) tears the deployment down before leaving, so no
engine process outlives the runner.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path
from typing import Any

from servelab import engines, paths, provenance
from servelab.engines.base import Engine
from servelab.errors import UserError
from servelab.experiment import evidence, interference, pinning, processes
from servelab.experiment.deploy import DeployError, Deployment, on_main_thread
from servelab.experiment.measure import MeasureFn, Measurement, PairedFn, bench_measure
from servelab.experiment.schedule import PlannedRun, plan
from servelab.experiment.spec import SWEEP_KEY, ExperimentSpec
from servelab.store import Store


@dataclass(frozen=True, slots=True)
class RunnerResult:
    planned: int
    already_done: int
    ok: int
    failed: int
    interrupted: bool


def _sigterm_as_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


class Runner:
    """Runs one experiment into a store; `say` gets plain-text progress lines (present.py styles)."""

    def __init__(
        self,
        spec: ExperimentSpec,
        store: Store,
        *,
        measure: MeasureFn | None = None,
        measure_paired: PairedFn | None = None,
        say: Callable[[str], None] = print,
        log_root: Path | None = None,
        on_progress: Callable[[int, int, str], None] | None = None,
    ) -> None:
        self.spec, self.store = spec, store
        self.measure = measure or bench_measure
        # a block's capacity sweeps alternate point by point ([load.sweep] paired); a test that
        # measures with its own function measures them one after the other unless it gives one
        if measure_paired is None and measure is None:
            from servelab.experiment.capacity import measure_paired
        self.measure_paired = measure_paired
        self.say = say
        self.engine: Engine = engines.get(spec.engine)
        self.log_root = log_root or paths.home() / "experiments" / spec.name / "logs"
        self.on_progress = on_progress
        self._active: list[Deployment] = []  # torn down on any exit, whatever happens
        self.pins = pinning.PinPlan(None, {}, "")
        self._pause_note: tuple[float, str] | None = None  # for the next run's record

    def todo(self) -> tuple[list[PlannedRun], list[PlannedRun], int]:
        """(all planned runs, those still to run, failed runs among them)."""
        runs = plan(self.spec)
        status = {
            (r.arm, r.load_key, r.repetition): r.status for r in self.store.runs(self.spec.name)
        }
        todo = [p for p in runs if status.get(p.key) != "ok"]
        failed = sum(1 for p in todo if status.get(p.key) == "failed")
        return runs, todo, failed

    def run(self, job_log: str | None = None) -> RunnerResult:
        """Run what is missing; re-raises KeyboardInterrupt after a clean teardown."""
        from servelab import jobs
        from servelab.jobs import Job

        spec = self.spec
        for other in jobs.read_all(spec.name):
            if other.state == "running" and other.pid != os.getpid():
                raise UserError(
                    f"experiment '{spec.name}' is already running (pid {other.pid}); "
                    f"follow it with `servelab status {spec.name}`"
                )
        resumed = self.store.ensure_experiment(spec.name, spec.to_json(), spec.design_hash())
        runs, todo, failed_before = self.todo()
        n_arms, n_loads = len(spec.arms), len(spec.load.keys())
        if resumed:
            self.say(
                f"resuming experiment '{spec.name}': {len(runs) - len(todo)} of {len(runs)} runs "
                f"already stored, {len(todo)} to run"
                + (f" ({failed_before} failed earlier, retried)" if failed_before else "")
            )
        else:
            reps = (
                f"{spec.adaptive.min}-{spec.adaptive.max} adaptive repetitions (budget "
                f"{spec.adaptive.budget_s:g} s)"
                if spec.adaptive_on
                else f"{spec.repetitions} repetitions"
            )
            upto = "up to " if spec.blocks != spec.repetitions else ""
            self.say(
                f"experiment '{spec.name}': {upto}{len(runs)} runs = {n_arms} arms x {n_loads} "
                f"load points x {reps}, {spec.order}"
            )
        job = Job(spec.name, "experiment", total=len(todo), log=job_log)
        job.update(already_done=len(runs) - len(todo), planned=len(runs))
        ok = failed = 0
        old = signal.signal(signal.SIGTERM, _sigterm_as_interrupt) if on_main_thread() else None
        own_mask = pinning.available()
        self.pins = pinning.plan(spec.noise.pin, list(spec.arms))
        if spec.engine != "external":
            self.say(f"core pinning: {self.pins.note}")
        if self.pins.active:
            pinning.pin([os.getpid()], self.pins.client or ())
        t0, block_s = time.monotonic(), []
        try:
            for block, block_runs in groupby(todo, key=lambda p: p.block):
                why = self._stop_before(block, time.monotonic() - t0, block_s)
                if why:
                    self.say(why)
                    break
                self._maybe_pause()
                tb = time.monotonic()
                for _, group in groupby(list(block_runs), key=lambda p: p.group):
                    for p, status in self._run_group(list(group), job):
                        ok += status == "ok"
                        failed += status == "failed"
                        job.update(done=ok + failed, failed=failed)
                        if self.on_progress:
                            self.on_progress(ok + failed, len(todo), p.describe())
                block_s.append(time.monotonic() - tb)
            else:
                if spec.adaptive_on:
                    self.say(self._stop_before(None, 0.0, []) or "adaptive: maximum reached")
        except KeyboardInterrupt:
            job.finish("interrupted")
            self.say(
                f"interrupted: {ok + failed} runs of this session stored, no engine left running; "
                f"run the same command again to resume"
            )
            raise
        finally:
            while self._active:                      # last launched first; the last one
                d = self._active.pop()                # stopped waits for the GPU memory
                d.stop(wait_gpu=not self._active)
            if old is not None:
                signal.signal(signal.SIGTERM, old)
            if self.pins.active and own_mask:
                pinning.pin([os.getpid()], own_mask)
        job.finish("finished" if ok or not todo else "failed")
        self.say(
            f"done: {ok} runs ok, {failed} failed, {len(runs) - len(todo)} were already stored"
        )
        return RunnerResult(
            planned=len(runs),
            already_done=len(runs) - len(todo),
            ok=ok,
            failed=failed,
            interrupted=False,
        )

    # ---- when to stop, when to wait -----------------------------------------------------------

    def _stop_before(self, block: int | None, elapsed_s: float, block_s: list[float]) -> str | None:
        """Why not to run `block` (None: after the last planned block), or None to run it.
        Fixed repetitions run `repetitions` blocks plus one per block left out for interference;
        adaptive ones stop when every primary effect is decided, at the maximum, or when the
        next block would overrun the time budget (estimated by this session's slowest block)."""
        spec = self.spec
        repeats = spec.noise.on_interference == "repeat"
        if block is None and not spec.adaptive_on:
            return None
        if not spec.adaptive_on and not repeats:
            return None  # the plan holds exactly the blocks to run
        from servelab.experiment.stats import undecided

        ev = evidence.gather(self.store, spec.name, metrics=[spec.primary_metric])
        base = spec.adaptive.max if spec.adaptive_on else int(spec.repetitions)  # type: ignore[arg-type]
        if block is not None and block >= base + len(ev.excluded):
            if not spec.adaptive_on:
                return (
                    f"all {base} blocks measured ({len(ev.excluded)} disturbed block(s) "
                    "replaced by extra ones)"
                )
            return f"adaptive: maximum of {spec.adaptive.max} blocks reached; " + _undecided_text(
                undecided(ev.analysis, spec.primary_metric)
            )
        if not spec.adaptive_on:
            return None
        left = undecided(ev.analysis, spec.primary_metric)
        if not left:
            return (
                f"adaptive: every primary effect decided after {ev.blocks_used} blocks; stopping"
            )
        if block is None:
            return f"adaptive: all planned blocks run; {_undecided_text(left)}"
        # the slowest block so far as the estimate: on a loaded machine blocks slow down as the
        # load grows, and the mean let the demo overrun its 250 s budget by 14 s (load 9.6)
        if block_s and elapsed_s + max(block_s) > spec.adaptive.budget_s:
            return (
                f"adaptive: time budget of {spec.adaptive.budget_s:g} s spent after "
                f"{ev.blocks_used} blocks ({elapsed_s:.0f} s); {_undecided_text(left)}"
            )
        return None

    def _our_pids(self) -> list[int]:
        return [os.getpid()] + [pid for d in self._active for pid in d.pids()]

    def _maybe_pause(self) -> None:
        """With on_interference = 'pause': wait (up to pause_s) until the machine is below the
        thresholds before a block; the wait is recorded with the block's first run."""
        n = self.spec.noise
        if n.on_interference != "pause" or (n.max_other_cpu is None and n.max_steal is None):
            return
        t0 = time.monotonic()
        why = interference.crossed(
            interference.sample(self._our_pids()), n.max_other_cpu, n.max_steal
        )
        first = why
        while why and time.monotonic() - t0 < n.pause_s:
            self.say(f"pausing: {why}")
            time.sleep(min(5.0, max(0.0, n.pause_s - (time.monotonic() - t0))))
            why = interference.crossed(
                interference.sample(self._our_pids()), n.max_other_cpu, n.max_steal
            )
        if first:
            waited = time.monotonic() - t0
            self._pause_note = (waited, first + ("; still so after the wait" if why else ""))

    # ---- one deployment ------------------------------------------------------------------------

    def _run_group(self, group: list[PlannedRun], job: Any) -> Iterator[tuple[PlannedRun, str]]:
        """The runs of one group; each arm's deployment is launched at its first run in the group
        (restart 'block': every arm of the block is up at once) and all are stopped at the end.
        With `[load.sweep] paired`, the group's capacity runs are measured together: at the
        first of them every arm's deployment is up and the sweeps alternate point by point."""
        spec = self.spec
        if not self.engine.launches:
            assert spec.url
            for p in group:
                yield p, self._measure([(p, spec.url, None)], job)[p.key]
            return
        deps: dict[str, Deployment | DeployError] = {}
        done: dict[tuple[str, str, int], str] = {}  # statuses of runs measured with an earlier one
        pair = (spec.load.sweep is not None and spec.load.sweep.paired
                and self.measure_paired is not None)
        try:
            for p in group:
                if p.key in done:
                    yield p, done.pop(p.key)
                    continue
                together = [p] + ([q for q in group if q.load_key == p.load_key
                                   and q.arm != p.arm and q.seq > p.seq]
                                  if pair and p.load_key == SWEEP_KEY else [])
                live = []
                for q in together:
                    if q.arm not in deps:
                        job.update(current=f"{q.describe()} (launching)")
                        dep, error = self._launch(q)
                        deps[q.arm] = dep if dep is not None else error  # type: ignore[assignment]
                    d = deps[q.arm]
                    if isinstance(d, DeployError):
                        self._failed(q, str(d), d.log_tail)
                        done[q.key] = "failed"
                    elif why := d.lost():  # a process exited, or its Ray node died
                        self._failed(q, f"before the run: {why}", d.log_tail())
                        done[q.key] = "failed"
                    else:
                        live.append((q, d.url, d))
                if live:
                    done.update(self._measure(live, job))
                yield p, done.pop(p.key)
        finally:
            # last launched, first stopped; only the first launched (stopped last) waits for
            # the GPU memory to return to its launch-time level, which held none of the block's
            # engines: the others' memory grows while they serve (seen on the H200: a stop that
            # waited with other arms still up timed out after 120 s)
            launched = [(arm, d) for arm, d in deps.items() if isinstance(d, Deployment)]
            for i, (arm, d) in reversed(list(enumerate(launched))):
                d.stop(wait_gpu=i == 0)
                if d.warning:
                    self.say(f"warning: arm {arm}: {d.warning}")
                if d in self._active:
                    self._active.remove(d)

    def _store_run(self, p: PlannedRun, **outcome: Any) -> None:
        """Store one planned run: its place in the plan plus `outcome` (status, error, ...)."""
        self.store.add_run(
            experiment=self.spec.name,
            arm=p.arm,
            load_key=p.load_key,
            repetition=p.repetition,
            block=p.block,
            seq=p.seq,
            **outcome,
        )

    def _failed(self, p: PlannedRun, error: str, log_tail: str,
                started: float | None = None) -> None:
        """Store a run that produced no load point (`started` defaults to now) and say why."""
        self._store_run(
            p,
            status="failed",
            error=error,
            log_tail=log_tail,
            started=time.time() if started is None else started,
        )
        self.say(f"failed {p.describe()}: {error}")

    def _launch(self, p: PlannedRun) -> tuple[Deployment | None, DeployError | None]:
        spec = self.spec
        t = spec.timeouts
        last: DeployError | None = None
        for attempt in range(spec.retries + 1):
            log_dir = self.log_root / f"{p.seq:04d}-{p.arm}-try{attempt}"
            dep = Deployment(
                self.engine,
                spec.model,
                processes.resolve(spec, p.arm),
                log_dir,
                ready_timeout_s=t.ready_s,
                grace_s=t.teardown_s,
                port_free_s=t.port_free_s,
                gpu_free_s=t.gpu_free_s,
            )
            t0 = time.monotonic()
            self._active.append(dep)
            cores = self.pins.engines.get(p.arm) if self.pins.active else None
            try:
                if cores:  # the engine's processes inherit the launching thread's cores
                    os.sched_setaffinity(0, cores)
                try:
                    dep.start()
                finally:
                    if cores:
                        os.sched_setaffinity(0, self.pins.client or ())
                if cores:  # and every thread of them, should one have been started elsewhere
                    pinning.pin(dep.pids(), cores)
                self.say(f"deployed arm {p.arm} in {time.monotonic() - t0:.1f} s at {dep.url}")
                return dep, None
            except DeployError as exc:
                self._active.remove(dep)
                last = exc
                self.say(
                    f"launch of arm {p.arm} failed (attempt {attempt + 1} of "
                    f"{spec.retries + 1}): {exc}"
                )
        return None, last

    def _measure(self, live: list[tuple[PlannedRun, str, Deployment | None]],
                 job: Any) -> dict[tuple[str, str, int], str]:
        """Measure `live` runs ((run, url, deployment) each; several: paired capacity sweeps),
        store each, and return their statuses by run key."""
        spec = self.spec
        job.update(current=live[0][0].describe())
        started = time.time()
        befores = [self.engine.scrape(url) for _, url, _ in live]
        pids = self._our_pids()
        snap = interference.snapshot(pids)
        outs: list[Measurement | BaseException]
        if len(live) == 1:
            p, url, _ = live[0]
            try:
                outs = [self.measure(url, spec, p)]
            except (KeyboardInterrupt, SystemExit, UserError):
                raise  # a configuration problem stops the experiment (after teardown)
            except Exception as exc:  # a broken run is recorded, the experiment goes on
                outs = [exc]
        else:
            assert self.measure_paired is not None
            outs = self.measure_paired(
                [(url, spec, p) for p, url, _ in live],
                lambda p, role, key: job.update(current=f"{p.describe()}: {role} {key}"))
        inter = self._interference(snap, pids)
        return {p.key: self._record(p, url, dep, out, before, inter, started)
                for (p, url, dep), out, before in zip(live, outs, befores, strict=True)}

    def _record(self, p: PlannedRun, url: str, dep: Deployment | None,
                m: Measurement | BaseException, before: Any, inter: dict[str, Any],
                started: float) -> str:
        """Store one measured run (or its failure) with its provenance; its status."""
        spec = self.spec
        if isinstance(m, BaseException):
            why = dep.lost() if dep else None
            self._failed(p, f"during the run: {why}" if why else f"{type(m).__name__}: {m}",
                         dep.log_tail() if dep else "", started)
            return "failed"
        if dep and (why := dep.lost()):  # a process (or its node) lost mid-run: not a result
            self._failed(p, f"during the run: {why}", dep.log_tail(), started)
            return "failed"
        window = self.engine.acceptance(before, self.engine.scrape(url))
        summary = dict(m.summary)
        if summary.get("accept_length") is None and window["accept_length"] is not None:
            summary["accept_length"] = window["accept_length"]
            summary["accept_length_source"] = window["source"]
        info = self.engine.info(url) or m.server_info or None
        prov = provenance.collect(
            experiment=spec.name,
            arm=p.arm,
            repetition=p.repetition,
            block=p.block,
            seq=p.seq,
            engine=spec.engine,
            model=spec.model,
            processes=dep.argvs if dep else None,
            server_info=info,
            bench=m.bench,
            workload=spec.workload.model_dump(mode="json"),
            spec_window=window,
            interference=inter,
            pinning={
                **self.pins.to_json(),
                "client_actual": pinning.affinity(os.getpid()),
                "engine_actual": pinning.affinity(dep.pids()[0]) if dep and dep.pids() else None,
            },
        )
        ids = [
            self.store.add_load_point(
                summary=x["summary"], provenance=prov, load_key=x["load_key"],
                source="experiment", label=f"{spec.name}/{p.arm}", base_url=url,
                model=spec.model or None, concurrency=x["concurrency"],
                request_rate=x["request_rate"], requests=x["records"],
            )
            for x in m.extra_points
        ]
        if ids:
            summary["sweep_point_ids"] = ids
        at = (summary.get("capacity") or {}).get("load") or {}  # a sweep: the point at capacity
        lp = self.store.add_load_point(
            summary=summary,
            provenance=prov,
            load_key=at.get("key", p.load_key),
            source="experiment",
            label=f"{spec.name}/{p.arm}",
            base_url=url,
            model=spec.model or None,
            concurrency=at.get("concurrency", p.concurrency),
            request_rate=at.get("request_rate", p.request_rate),
            requests=m.records,
        )
        completed = summary.get("completed") or 0
        status = "ok" if completed > 0 else "failed"
        error = (
            None if status == "ok" else f"no request completed ({summary.get('failure_reasons')})"
        )
        self._store_run(
            p,
            status=status,
            load_point_id=lp,
            error=error,
            log_tail=(dep.log_tail() if dep else None) if error else None,
            started=started,
        )
        if inter.get("flagged"):
            self.say(f"interference: {p.describe()}: {inter['flagged']}")
        tput = summary.get(spec.primary_metric)
        self.say(
            f"{'ok' if status == 'ok' else 'failed'} {p.describe()}: "
            f"{spec.primary_metric} {_fmt(tput)}, {completed} requests ok, "
            f"{summary.get('failed') or 0} failed ({time.time() - started:.1f} s; other "
            f"processes {_fmt(inter.get('other_cpu_cores'))} cores)"
            + (f": {error}" if error else "")
        )
        return status

    def _interference(self, snap: interference.Snapshot, pids: list[int]) -> dict[str, Any]:
        """The record of the run just measured, flagged against the spec's thresholds."""
        n = self.spec.noise
        rec = interference.record(snap, interference.snapshot(pids))
        out = rec.to_json()
        out["flagged"] = interference.crossed(rec, n.max_other_cpu, n.max_steal)
        if self._pause_note:
            out["paused_s"], out["pause_reason"] = self._pause_note
            self._pause_note = None
        return out


def _undecided_text(left: list[tuple[str, str]]) -> str:
    if not left:
        return "every primary effect decided"
    return "left undecided: " + ", ".join(f"{a} at {lk}" for a, lk in left)


def _fmt(x: object) -> str:
    return f"{x:.4g}" if isinstance(x, int | float) else "n/a"
