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

from servelab import engines, jobs, paths
from servelab.engines.base import Engine
from servelab.errors import UserError
from servelab.experiment.deploy.base import DeployError, on_main_thread
from servelab.experiment.deploy.deployment import Deployment
from servelab.experiment.design.metrics import METRICS
from servelab.experiment.design.model import ExperimentSpec
from servelab.experiment.design.sweep import SWEEP_KEY
from servelab.experiment.plan import processes
from servelab.experiment.plan.schedule import PlannedRun, plan
from servelab.experiment.run import interference, pinning, sweeps
from servelab.experiment.run.measure import bench_measure
from servelab.experiment.run.measurement import MeasureFn, Measurement, PairedFn
from servelab.experiment.run.record import Recorder
from servelab.experiment.stats import evidence
from servelab.experiment.stats.analysis import undecided
from servelab.jobs import Job
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
    """Runs one experiment into a store; `say` gets plain-text progress lines (present.py styles).
    What is stored of each run, and how, is record.py's."""

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
            measure_paired = sweeps.measure_paired
        self.measure_paired = measure_paired
        self.say = say
        self.engine: Engine = engines.get(spec.engine)
        self.log_root = log_root or paths.home() / "experiments" / spec.name / "logs"
        self.on_progress = on_progress
        self._active: list[Deployment] = []  # torn down on any exit, whatever happens
        self.pins = pinning.PinPlan(None, {}, "")
        self.record = Recorder(spec, store, self.engine, say)  # what is kept of each run

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
        spec = self.spec
        for other in jobs.read_all(spec.name):
            if other.state == "running" and other.pid != os.getpid():
                raise UserError(
                    f"experiment '{spec.name}' is already running (pid {other.pid}); "
                    f"follow it with `servelab status {spec.name}`"
                )
        resumed = self.store.ensure_experiment(spec.name, spec.to_json(), spec.design_hash(),
                                               spec.legacy_design_hashes())
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
        self._warn_energy_unmeasured()
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

    def _warn_energy_unmeasured(self) -> None:
        """An energy metric decides, and this host's GPUs give no energy readings: say so
        before the first run, not as `n/a` after the last (engines on Ray hosts are sampled
        there, so this host says nothing about them)."""
        pm = self.spec.primary_metric
        if METRICS[pm].path[0] not in ("j_per_output_token", "output_tokens_per_j") \
                or self.spec.uses_ray:
            return
        from servelab.telemetry import gpu

        status = gpu.state()[0]
        if status != "ok":
            self.say(f"warning: primary_metric {pm} needs GPU energy readings and NVML is "
                     f"{status} on this host: every verdict on it will be n/a (run where the "
                     "engine's GPUs are, or decide on another metric)")

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
            why_first = first + ("; still so after the wait" if why else "")
            self.record.pause_note = (waited, why_first)

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
                        self.record.failed(q, str(d), d.log_tail)
                        done[q.key] = "failed"
                    elif why := d.lost():  # a process exited, or its Ray node died
                        self.record.failed(q, f"before the run: {why}", d.log_tail())
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
        inter = self.record.interference(snap, pids)
        return {p.key: self.record.measured(p, url, dep, out, before, inter, started,
                                            self.pins)
                for (p, url, dep), out, before in zip(live, outs, befores, strict=True)}

def _undecided_text(left: list[tuple[str, str]]) -> str:
    if not left:
        return "every primary effect decided"
    return "left undecided: " + ", ".join(f"{a} at {lk}" for a, lk in left)


