"""Does `servelab demo` decide on a noisy machine? Runs the demo N times with a busy loop keeping
one core busy (started here), and an A/A version of it (the MTP arm replaced by a copy of the
baseline) N times, interleaved; records each run's verdicts, blocks used, wall time and the
machine's load. Results go to a JSON file after every run; running it again resumes.

    python benchmarks/bench_demo_noise.py --runs 10 --out /tmp/demo_noise.json [--repo DIR]

`--repo` runs the servelab of another checkout (e.g. a snapshot of a commit, so that editing
this one while it runs changes nothing). Goal (issue 22): MTP "better" at c=1 in >= 9 of 10
runs, never "worse", each within 300 s; the A/A version calls a difference in <= 1 of 10.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def aa_file(repo: Path, out: Path) -> Path:
    """The demo with its MTP arm made identical to the baseline, under its own name."""
    text = (repo / "examples" / "demo.toml").read_text()
    text = re.sub(r'(?m)^name = "demo"', 'name = "demo-aa"', text)
    text = re.sub(r"(?m)^recipe = .*\n", "", text)
    text = text.replace("[arms.mtp]", "[arms.a-again]")
    text = re.sub(r'(?m)^description = "Config B.*"', 'description = "identical to baseline"', text)
    out.write_text(text)
    return out


def verdicts(repo: Path, home: Path, name: str) -> dict:
    """Per load point of the primary metric: ratio, CI, verdict, pairs; plus blocks used."""
    code = (
        "import json,sys\n"
        "from servelab.store import Store\n"
        "from servelab.experiment.report.data import collect\n"
        f"st=Store({str(home / 'results.db')!r}); d=collect(st,{name!r})\n"
        "an=d.analysis; out={'blocks_used': d.blocks_used, 'flagged': len(d.flagged), 'effects': {}}\n"
        "for (arm,lk,m),e in an.effects.items():\n"
        "    if m==d.primary: out['effects'][lk]={'ratio':e.ratio,'lo':e.ci_low,'hi':e.ci_high,"
        "'verdict':e.verdict,'n':e.n,'decided_at':e.decided_at}\n"
        "print(json.dumps(out))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(repo / "src"), "SERVELAB_HOME": str(home)}
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    return json.loads(p.stdout) if p.returncode == 0 else {"error": p.stderr[-500:]}


def one(repo: Path, kind: str, i: int, work: Path, timeout_s: float) -> dict:
    home = work / f"home-{kind}-{i}"
    env = {
        **os.environ,
        "PYTHONPATH": str(repo / "src"),
        "SERVELAB_HOME": str(home),
        "COLUMNS": "200",
    }
    argv = [sys.executable, "-m", "servelab", "demo"]
    name = "demo"
    if kind == "aa":
        argv += ["--file", str(aa_file(repo, work / "demo_aa.toml"))]
        name = "demo-aa"
    load0 = os.getloadavg()
    t0 = time.monotonic()
    try:
        p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s)
        rc, out = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out = 124, str(exc.stdout or "")
    wall = time.monotonic() - t0
    (work / f"log-{kind}-{i}.txt").write_text(out)
    rec = {
        "kind": kind,
        "i": i,
        "rc": rc,
        "wall_s": round(wall, 1),
        "load1_before": load0[0],
        "load1_after": os.getloadavg()[0],
        "utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }
    rec.update(verdicts(repo, home, name))
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--out", type=Path, default=Path("/tmp/demo_noise.json"))
    ap.add_argument("--repo", type=Path, default=HERE)
    ap.add_argument("--work", type=Path, default=Path("/tmp/demo_noise_work"))
    ap.add_argument("--kinds", default="mtp,aa")
    ap.add_argument("--timeout-s", type=float, default=600)
    ap.add_argument("--no-busy", action="store_true", help="leave out the busy loop")
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    done = json.loads(a.out.read_text()) if a.out.exists() else {"runs": []}
    have = {(r["kind"], r["i"]) for r in done["runs"]}
    busy = None
    if not a.no_busy:  # one core kept busy for the whole benchmark
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    done.setdefault("busy_loop", not a.no_busy)
    done.setdefault("cpus", os.cpu_count())
    try:
        for i in range(a.runs):
            for kind in a.kinds.split(","):
                if (kind, i) in have:
                    continue
                rec = one(a.repo, kind, i, a.work, a.timeout_s)
                done["runs"].append(rec)
                tmp = a.out.with_suffix(".tmp")
                tmp.write_text(json.dumps(done, indent=1))
                tmp.replace(a.out)  # atomic: a kill never leaves half a file
                eff = rec.get("effects", {})
                print(
                    f"{rec['utc']} {kind} {i}: rc {rec['rc']} {rec['wall_s']} s, load "
                    f"{rec['load1_before']:.1f}->{rec['load1_after']:.1f}, blocks "
                    f"{rec.get('blocks_used')}: "
                    + ", ".join(
                        f"{k} {v['verdict']} ({(v['ratio'] - 1) * 100:+.1f}%)"
                        for k, v in eff.items()
                    ),
                    flush=True,
                )
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    summarize(done)


def summarize(done: dict) -> None:
    for kind in ("mtp", "aa"):
        rs = [r for r in done["runs"] if r["kind"] == kind]
        if not rs:
            continue
        c1 = [r.get("effects", {}).get("c=1", {}).get("verdict") for r in rs]
        called = sum(
            any(v.get("verdict") in ("better", "worse") for v in r.get("effects", {}).values())
            for r in rs
        )
        slow = sum(r["wall_s"] > 300 for r in rs)
        print(
            f"{kind}: {len(rs)} runs; c=1 verdicts {c1}; runs calling any difference {called}; "
            f"over 300 s: {slow}; wall {min(r['wall_s'] for r in rs)}-{max(r['wall_s'] for r in rs)} s"
        )


if __name__ == "__main__":
    main()
