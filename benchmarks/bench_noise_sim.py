"""Error rates of the experiment verdicts under realistic machine noise, by simulation.

Each simulated experiment is a sequence of interleaved blocks; a block gives one run of each arm
(seconds apart) and their throughput ratio. The noise model is fitted by eye to the demo's stored
runs on the 2-core VM (docs/EXPERIMENTS.md gives the numbers it rests on):

- heavy tails: each run's log throughput has Student-t noise with 3 degrees of freedom;
- drift: the machine's speed follows a random walk from block to block, and moves a little
  between the two runs of a block (they are seconds apart, not simultaneous);
- bursts: with some probability a run is hit by a burst of other work and loses 10-60% of its
  throughput (one run, not its partner: a burst is shorter than a block).

For each rule it reports the A/A false-positive rate (a verdict of better or worse between
identical arms), the power against a true +20% effect (verdict better), the cost (blocks
run until the decision), and how often the rule's interval missed the true ratio at any look
(band 0: the error rate the rule promises to keep at alpha, peeking included). Rules: fixed repetitions (3, 5, 10 blocks) with servelab's bootstrap CI
and noise band, and adaptive repetitions (experiment/stats/sequential.py) with the same band.

    python benchmarks/bench_noise_sim.py --experiments 1000 --out /tmp/noise_sim.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass

import numpy as np

from servelab.experiment.report.noise import rule_name
from servelab.experiment.stats import sequential as seq
from servelab.experiment.stats.bootstrap import bootstrap_ratio, verdict


@dataclass(frozen=True)
class Noise:
    name: str
    run_sd: float  # scale of the per-run t(3) noise, log units
    drift_sd: float  # random-walk step per block, log units
    within_sd: float  # drift between the two runs of a block
    burst_p: float  # chance that a run is hit by a burst
    burst_max: float  # a burst removes U(0.1, burst_max) of the throughput
    arm_offset_sd: float = 0.0  # an offset one arm keeps for a whole experiment, log units


# fitted to the demo at c=1: quiet (one helper's tests beside it): pair log-ratio sd ~0.13;
# loaded (load average 5-6 on 2 cores plus a busy loop): sd ~0.2-0.3 with bursts
MODELS = (
    Noise("quiet", run_sd=0.06, drift_sd=0.05, within_sd=0.02, burst_p=0.05, burst_max=0.4),
    Noise("loaded", run_sd=0.09, drift_sd=0.10, within_sd=0.04, burst_p=0.12, burst_max=0.6),
    # a pessimistic case: one 2026-12-02 benchmark (10 A/A demos, one core busy) saw the run
    # means of the block log ratios spread 1.5x wider than the blocks' own spread implies, as if
    # one identical arm kept an offset of SD ~0.05 for a whole run (the next 10 did not); no
    # interval from the run's own blocks can see such an offset
    Noise(
        "loaded+offset",
        run_sd=0.09,
        drift_sd=0.10,
        within_sd=0.04,
        burst_p=0.12,
        burst_max=0.6,
        arm_offset_sd=0.05,
    ),
)


def blocks(rng: np.random.Generator, noise: Noise, n: int, log_effect: float) -> np.ndarray:
    """Per-block log ratios arm/baseline for one experiment of n blocks (ABBA order)."""
    drift = np.cumsum(rng.normal(0, noise.drift_sd, n))
    offset = rng.normal(0, noise.arm_offset_sd) if noise.arm_offset_sd else 0.0
    out = np.empty(n)
    for b in range(n):
        runs = []
        for k in range(2):
            x = drift[b] + k * rng.normal(0, noise.within_sd)
            x += noise.run_sd * rng.standard_t(3) / math.sqrt(3)
            if rng.random() < noise.burst_p:
                x += math.log(1 - rng.uniform(0.1, noise.burst_max))
            runs.append(x)
        first_is_base = b % 2 == 0  # ABBA: the baseline leads even blocks
        base, arm = (runs[0], runs[1]) if first_is_base else (runs[1], runs[0])
        out[b] = arm + log_effect + offset - base
    return out


def rule_key(d: seq.Design) -> str:
    """How the report finds a design's measured rates (experiment/report/noise.py
    measured_rate_line)."""
    return rule_name(d)


def fixed_verdict(logr: np.ndarray, n: int, band: float, seed: int) -> str:
    r = np.exp(logr[:n])
    ratio, lo, hi = bootstrap_ratio(np.ones(n), r, paired=True, n_boot=2000, seed=seed)
    return verdict(ratio, lo, hi, band, True)


@dataclass
class Cell:
    noise: str
    rule: str
    effect: float
    experiments: int
    called_better: float
    called_worse: float
    no_change: float
    mean_blocks: float
    excludes_truth: float  # the interval missed the true ratio (band 0): the rule's own error


def simulate(noise: Noise, effect: float, n_exp: int, band: float, seed: int) -> list[Cell]:
    """One (noise, effect) cell: n_exp experiments under every rule."""
    rng = np.random.default_rng(seed)
    designs = {  # the default; the demo's (c=1 primary, O'Brien-Fleming) with its Pocock twin;
        # earlier demos' (3 and 2 primary load points) and aa_noise.toml's (2)
        rule_key(d): d
        for d in (
            seq.Design(5, 20, 0.05, 1),
            seq.Design(4, 12, 0.05, 1, "obrien-fleming"),
            seq.Design(4, 12, 0.05, 1),
            seq.Design(4, 10, 0.05, 3),
            seq.Design(4, 12, 0.05, 2),
        )
    }
    tallies: dict[str, list] = {f"fixed {n}": [] for n in (3, 5, 10)}
    tallies["naive peeking 3-10"] = []
    tallies.update({k: [] for k in designs})
    log_e = math.log(effect)
    for i in range(n_exp):
        x = blocks(rng, noise, 20, log_e)
        for n in (3, 5, 10):
            miss = fixed_verdict(x - log_e, n, 0.0, i) in ("better", "worse")
            tallies[f"fixed {n}"].append((fixed_verdict(x, n, band, i), n, miss))
        # the peeking problem: a fixed-n 95% CI recomputed after every block, stopping at the
        # first verdict; its error is the chance that ANY look excluded the truth
        v, used, miss = "within noise", 10, False
        for n in range(3, 11):
            miss = miss or fixed_verdict(x - log_e, n, 0.0, i) in ("better", "worse")
            if v == "within noise" and (got := fixed_verdict(x, n, band, i)) != "within noise":
                v, used = got, n
        tallies["naive peeking 3-10"].append((v, used, miss))
        for name, d in designs.items():
            b = seq.confidence_sequence(x, d, band, True)
            truth = seq.confidence_sequence(x - log_e, d, 0.0, True)
            miss = truth.verdict in (seq.BETTER, seq.WORSE)
            tallies[name].append((b.verdict, b.decided_at or d.max_n, miss))
    cells = []
    for rule, vs in tallies.items():
        v = [a for a, _, _ in vs]
        cells.append(
            Cell(
                noise.name,
                rule,
                effect,
                n_exp,
                v.count("better") / n_exp,
                v.count("worse") / n_exp,
                (v.count("no change")) / n_exp,
                float(np.mean([c for _, c, _ in vs])),
                float(np.mean([m for _, _, m in vs])),
            )
        )
    return cells


def _simulate(job: tuple) -> list[Cell]:
    return simulate(*job)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--experiments", type=int, default=1000)
    ap.add_argument("--band", type=float, default=0.02)
    ap.add_argument("--out", default="/tmp/noise_sim.json")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes")
    ap.add_argument(
        "--record",
        default=None,
        help="also write the A/A rates the report quotes "
        "(src/servelab/experiment/report/error_rates.json)",
    )
    a = ap.parse_args()
    t0 = time.time()
    cells: list[Cell] = []
    for k, noise in enumerate(MODELS):
        rng = np.random.default_rng(99 + k)
        pairs = np.concatenate([blocks(rng, noise, 20, 0.0) for _ in range(200)])
        print(f"{noise.name}: sd of a block's log ratio {pairs.std(ddof=1):.3f}", flush=True)
    jobs = [
        (noise, effect, a.experiments, a.band, 1000 * k + j)
        for k, noise in enumerate(MODELS)
        for j, effect in enumerate((1.0, 1.2))
    ]
    # each (noise, effect) cell has its own seed: the result is the same however many workers
    with ProcessPoolExecutor(max_workers=max(1, min(a.workers, len(jobs)))) as pool:
        for got in pool.map(_simulate, jobs):
            cells += got
    print(
        "| noise | rule | A/A false positives | power at +20% | blocks (A/A / +20%) "
        "| interval missed the truth (A/A / +20%) |"
    )
    print("|---|---|---|---|---|---|")
    for noise in MODELS:
        for rule in dict.fromkeys(c.rule for c in cells):
            aa = next(c for c in cells if (c.noise, c.rule, c.effect) == (noise.name, rule, 1.0))
            fx = next(c for c in cells if (c.noise, c.rule, c.effect) == (noise.name, rule, 1.2))
            print(
                f"| {noise.name} | {rule} | {(aa.called_better + aa.called_worse) * 100:.1f}% "
                f"| {fx.called_better * 100:.1f}% | {aa.mean_blocks:.1f} / {fx.mean_blocks:.1f} "
                f"| {aa.excludes_truth * 100:.1f}% / {fx.excludes_truth * 100:.1f}% |"
            )
    with open(a.out, "w") as f:
        json.dump(
            {
                "models": [asdict(m) for m in MODELS],
                "band": a.band,
                "cells": [asdict(c) for c in cells],
                "seconds": time.time() - t0,
            },
            f,
            indent=1,
        )
    if a.record:
        record(cells, a)
    print(f"{time.time() - t0:.0f} s; {a.out}")


def record(cells: list[Cell], a: argparse.Namespace) -> None:
    """The rates the experiment report quotes beside the rule it used."""
    rules: dict[str, dict] = {}
    for c in cells:
        r = rules.setdefault(c.rule, {})
        key = "aa" if c.effect == 1.0 else "effect_20pct"
        r.setdefault(c.noise, {})[key] = {
            "wrong_verdict": c.called_better + c.called_worse if key == "aa" else c.called_worse,
            "missed_truth": c.excludes_truth,
            "power": c.called_better if key != "aa" else None,
            "mean_blocks": c.mean_blocks,
        }
    out = {
        "what": "simulated error rates of the verdict rules (benchmarks/bench_noise_sim.py)",
        "date_utc": time.strftime("%Y-%m-%d", time.gmtime()),
        "command": f"python benchmarks/bench_noise_sim.py --experiments {a.experiments} "
        f"--band {a.band:g} --record {a.record}",
        "experiments_per_cell": a.experiments,
        "band": a.band,
        "rules": rules,
    }
    with open(a.record, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
