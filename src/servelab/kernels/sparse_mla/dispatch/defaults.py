"""Which split kernel a call runs by default: the measured rules of defaults/<gpu>.toml.

The data file lists rules in order (a match on cache format, heads, batch, row width ...),
each naming a geometry and the measurement it rests on. `candidates` returns the rules a call
matches, first one first: dispatch/launch.py runs the first whose variant can serve the launch and
falls to the next when one cannot (another GPU, a layout, a compile failure). The H200 file
is the only one measured; on another GPU it still applies (its Gluon rules are skipped there).
"""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from ..splitkv.geometry import MergePolicy, SplitConfig

HERE = Path(__file__).parent / "defaults"
GPU_FILES = {"NVIDIA H200": "h200.toml"}  # device name (prefix) -> data file
FALLBACK_FILE = "h200.toml"
MATCH_FIELDS = ("cache", "heads", "batch", "batch_x_heads_min", "d_qk", "fp8_tile")


@dataclass(frozen=True, slots=True)
class Measurement:
    """What a rule rests on: the time of its choice against the alternative, where and how."""

    cell: str
    before_us: float
    after_us: float
    date: str
    command: str
    note: str


@dataclass(frozen=True, slots=True)
class Rule:
    """One row of the defaults file: a match, the geometry it picks, and why."""

    index: int
    geometry_name: str
    config: SplitConfig
    why: str
    measured: Measurement
    cache: str | None = None
    heads: tuple[int, int] | None = None
    batch: tuple[int, int] | None = None
    batch_x_heads_min: int | None = None
    d_qk: int | None = None
    fp8_tile: tuple[int, int] | None = None

    def matches(self, b: int, h: int, d_qk: int, fp8_tile: int | None) -> bool:
        """Whether a call with batch b, h heads, rows of d_qk and this cache matches."""
        cache = "16bit" if fp8_tile is None else "fp8"
        ranges = ((self.heads, h), (self.batch, b), (self.fp8_tile, fp8_tile))
        return ((self.cache is None or self.cache == cache)
                and all(r is None or (v is not None and r[0] <= v <= r[1]) for r, v in ranges)
                and (self.batch_x_heads_min is None or b * h >= self.batch_x_heads_min)
                and (self.d_qk is None or self.d_qk == d_qk))  # fmt: skip


@dataclass(frozen=True, slots=True)
class Defaults:
    """A parsed defaults file: its GPU, merge policy, geometries and rules in order."""

    path: Path
    gpu: str
    merge: MergePolicy
    merge_measured: Measurement
    geometries: dict[str, SplitConfig]
    rules: tuple[Rule, ...]

    def candidates(self, b: int, h: int, d_qk: int, fp8_tile: int | None) -> list[Rule]:
        """The rules this call matches, in the file's order."""
        return [r for r in self.rules if r.matches(b, h, d_qk, fp8_tile)]


def _range(v, name: str, where: str) -> tuple[int, int] | None:
    if v is None:
        return None
    if not (isinstance(v, list) and len(v) == 2 and v[0] <= v[1]):
        raise ValueError(f"{where}: {name} must be [lo, hi] with lo <= hi, got {v!r}")
    return int(v[0]), int(v[1])


def parse(path: Path) -> Defaults:
    """Read and check a defaults file (unknown geometry, field or variant: ValueError naming it)."""
    data = tomllib.loads(path.read_text())
    names = {f.name for f in fields(SplitConfig)}
    geoms = {}
    for name, g in data["geometry"].items():
        unknown = set(g) - names
        if unknown:
            raise ValueError(f"{path.name}: geometry {name!r} has unknown fields {sorted(unknown)}")
        geoms[name] = SplitConfig(**g)
    rules = []
    for i, r in enumerate(data["rule"]):
        where = f"{path.name} rule {i} ({r.get('why', '')[:40]!r})"
        unknown = set(r) - {*MATCH_FIELDS, "why", "geometry", "measured"}
        if unknown:
            raise ValueError(f"{where}: unknown fields {sorted(unknown)}")
        if r["geometry"] not in geoms:
            raise ValueError(f"{where}: geometry {r['geometry']!r} is not one of {sorted(geoms)}")
        if r.get("cache") not in (None, "16bit", "fp8"):
            raise ValueError(f"{where}: cache must be '16bit' or 'fp8', got {r['cache']!r}")
        rules.append(Rule(
            index=i, geometry_name=r["geometry"], config=geoms[r["geometry"]], why=r["why"],
            measured=Measurement(**r["measured"]), cache=r.get("cache"),
            heads=_range(r.get("heads"), "heads", where),
            batch=_range(r.get("batch"), "batch", where),
            batch_x_heads_min=r.get("batch_x_heads_min"), d_qk=r.get("d_qk"),
            fp8_tile=_range(r.get("fp8_tile"), "fp8_tile", where),
        ))  # fmt: skip
    m = dict(data["merge"])
    measured = Measurement(**m.pop("measured"))
    return Defaults(path, data["gpu"], MergePolicy(**m), measured, geoms, tuple(rules))


@functools.cache
def load(file: str = FALLBACK_FILE) -> Defaults:
    """The parsed defaults file `file` under defaults/ (cached)."""
    return parse(HERE / file)


def for_device(device: torch.device | None) -> Defaults:
    """The defaults of `device`'s GPU, or the H200's (the only one measured) elsewhere."""
    if device is not None and device.type == "cuda" and torch.cuda.is_available():
        name = _device_name(device.index if device.index is not None else
                            torch.cuda.current_device())  # fmt: skip
        for prefix, file in GPU_FILES.items():
            if name.startswith(prefix):
                return load(file)
    return load()


@functools.cache
def _device_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def geometry(name: str) -> SplitConfig:
    """A named geometry of the H200 defaults file (benchmarks and tests name them)."""
    return load().geometries[name]


def default_config(b: int, h: int, d_qk: int, fp8_tile: int | None = None, *,
                   gluon: bool = True, device: torch.device | None = None) -> SplitConfig:  # fmt: skip
    """The first matching rule's config; gluon=False skips the rules of Gluon variants (what
    runs where Gluon cannot). This is the choice before any launch: the launch record says
    what actually ran."""
    for rule in for_device(device).candidates(b, h, d_qk, fp8_tile):
        if gluon or not rule.config.kernel.startswith("gluon"):
            return rule.config
    raise AssertionError("the defaults file's last rule matches every call")  # pragma: no cover
