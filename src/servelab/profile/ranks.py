"""Every rank of a tensor-parallel trace set: per-rank busy share, imbalance, and communication
against the compute it overlaps (HTA's idle-time and comm/comp overlap breakdown).

SGLang writes one trace per TP rank, `{profile_id}-TP-{rank}.trace.json.gz`. The traces are read
one after the other and only a per-rank summary is kept, so memory is that of the largest single
trace (trace.py streams big ones), not of the set.

Per rank, over its steady-state steps (warm-up screened per rank as in phases.py), per step and
device (the busiest device counts, as for busy time in steps.py):
- communication: the union of the `communication` category's activities (NCCL all-reduce,
  all-gather, custom all-reduce, DeepEP); compute: the union of the other kernels (not memcpy /
  memset, HTA's "computation"); overlap = |comm AND compute| = |comm| + |compute| - |comm OR
  compute|; exposed communication = |comm| - overlap (what the step waits on).
- busy = |all activities|, idle = wall - busy, busy share = busy / wall.
Imbalance across ranks = (max - min) / max of the per-rank compute time: in TP every rank runs the
same kernels, so a rank with less compute waits for the others inside its collectives (its NCCL
time grows); the communication time alone would read that wait as work.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from servelab.errors import UserError
from servelab.profile.breakdown import Rules, load_rules
from servelab.profile.phases import screen
from servelab.profile.steps import by_device, clipped_intervals, find_steps, union_length
from servelab.profile.trace import read_trace

COMM = "communication"
NOT_COMPUTE = frozenset({COMM, "memcpy"})
_RANK_RE = re.compile(r"^(?P<id>.*?)-TP-(?P<rank>\d+)(?:-[A-Z]+-\d+)*\.(?:pt\.)?trace\.json(?:\.gz)?$")


@dataclass(frozen=True, slots=True)
class RankSummary:
    """One rank's steady-state totals (microseconds)."""

    rank: int
    trace: str
    n_steps: int
    n_warmup: int
    wall_us: float
    busy_us: float
    compute_us: float
    comm_us: float
    overlap_us: float

    @property
    def busy_share(self) -> float | None:
        return self.busy_us / self.wall_us if self.wall_us > 0 else None

    @property
    def exposed_comm_us(self) -> float:
        return self.comm_us - self.overlap_us


def rank_files(folder: Path) -> list[tuple[int, Path]]:
    """(rank, path) of the newest profile id's per-rank traces in `folder`."""
    sets: dict[str, dict[int, Path]] = {}
    for p in folder.iterdir():
        m = _RANK_RE.match(p.name)
        if m and p.is_file():
            sets.setdefault(m.group("id"), {})[int(m.group("rank"))] = p
    if not sets:
        names = sorted(p.name for p in folder.iterdir())[:10]
        raise UserError(f"{folder}: no per-rank traces named ID-TP-RANK.trace.json.gz; it holds "
                        f"{', '.join(names) or 'nothing'}")
    newest = max(sets, key=lambda k: max(p.stat().st_mtime for p in sets[k].values()))
    return sorted(sets[newest].items())


def summarize_rank(rank: int, path: Path, rules: Rules, step_regex: str | None = None) -> RankSummary:
    """Read one rank's trace and keep only its totals."""
    trace = read_trace(path, step_regex=step_regex)
    steps = find_steps(trace, step_regex)
    warm = {w.index for w in screen(trace, steps)[0]}
    wall = busy = compute = comm = overlap = 0.0
    n = 0
    for st in steps.steps:
        if st.index in warm:
            continue
        n += 1
        wall += st.wall_us
        best = (0.0, 0.0, 0.0, 0.0)  # busy, compute, comm, overlap of the busiest device
        for idx in by_device(trace, st.activities).values():
            cats = [rules.classify(trace.names[trace.name_idx[i]], trace.kind[i]) for i in idx]
            c_idx = [i for i, c in zip(idx, cats, strict=True) if c == COMM]
            k_idx = [i for i, c in zip(idx, cats, strict=True) if c not in NOT_COMPUTE]
            b = union_length(*clipped_intervals(trace, idx, st.start_us))
            u_c = union_length(*clipped_intervals(trace, c_idx, st.start_us))
            u_k = union_length(*clipped_intervals(trace, k_idx, st.start_us))
            u_ck = union_length(*clipped_intervals(trace, c_idx + k_idx, st.start_us))
            if b >= best[0]:
                best = (b, u_k, u_c, u_c + u_k - u_ck)
        busy += best[0]
        compute += best[1]
        comm += best[2]
        overlap += best[3]
    return RankSummary(rank, str(path), n, len(warm), wall, busy, compute, comm, overlap)


def analyze_ranks(folder: str | Path, rules: Rules | None = None,
                  step_regex: str | None = None) -> dict[str, Any]:
    """The per-rank table, the imbalance and the comm/compute overlap of a trace folder."""
    folder = Path(folder)
    rules = rules or load_rules()
    rows = [summarize_rank(r, p, rules, step_regex) for r, p in rank_files(folder)]
    comp = [r.compute_us for r in rows]
    slow = max(rows, key=lambda r: r.compute_us)
    fast = min(rows, key=lambda r: r.compute_us)
    imb = (slow.compute_us - fast.compute_us) / slow.compute_us if slow.compute_us > 0 else None
    comm = sum(r.comm_us for r in rows)
    return {
        "folder": str(folder),
        "n_ranks": len(rows),
        "ranks": [asdict(r) | {"busy_share": r.busy_share, "exposed_comm_us": r.exposed_comm_us,
                               "comm_overlap_fraction": (r.overlap_us / r.comm_us
                                                         if r.comm_us > 0 else None)}
                  for r in rows],
        "compute_imbalance": imb,
        "slowest_rank": slow.rank,
        "fastest_rank": fast.rank,
        "compute_us_range": [min(comp), max(comp)],
        "comm_overlap_fraction": (sum(r.overlap_us for r in rows) / comm if comm > 0 else None),
        "note": ("steady-state steps per rank; compute = non-communication kernels; overlap = "
                 "communication time with compute running on the same device"),
    }


def print_ranks(r: dict[str, Any], err: bool = False) -> None:
    """The per-rank table, imbalance and overlap first."""
    from rich.table import Table

    from servelab.console import make_console

    pct = lambda x: "n/a" if x is None else f"{100 * x:.1f}%"  # noqa: E731
    num = lambda x: f"{x:,.1f}"  # noqa: E731
    con = make_console(stderr=err)
    con.print(f"{r['n_ranks']} ranks: compute imbalance {pct(r['compute_imbalance'])} (rank "
              f"{r['slowest_rank']} slowest, {r['fastest_rank']} fastest); communication "
              f"overlapped with compute {pct(r['comm_overlap_fraction'])}", style="bold")
    t = Table(title="ranks (steady-state steps)")
    for c in ("rank", "steps", "warm-up", "wall us", "busy", "compute us", "comm us",
              "overlap us", "exposed comm us"):
        t.add_column(c, justify="right", no_wrap=True)
    for x in r["ranks"]:
        t.add_row(str(x["rank"]), str(x["n_steps"]), str(x["n_warmup"]), num(x["wall_us"]),
                  pct(x["busy_share"]), num(x["compute_us"]), num(x["comm_us"]),
                  num(x["overlap_us"]), num(x["exposed_comm_us"]))
    con.print(t)
    con.print(f"the report below is rank {r['ranks'][0]['rank']}'s ({r['ranks'][0]['trace']})",
              style="dim")
