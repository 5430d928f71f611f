"""Kineto / Chrome-trace reader: GPU activities, launches and step annotations, memory bounded.

PyTorch's profiler (and SGLang's `/start_profile`, which uses it) writes Chrome trace JSON, often
gzipped, with `traceEvents` holding CPU ops, CUDA runtime calls, GPU kernels and memcpys, and
`user_annotation` ranges such as `ProfilerStep#N` or SGLang's `step[DECODE bs=N]`. All times are
microseconds.

Small files are parsed whole with orjson (fast). Larger ones stream through ijson's C backend
one event at a time: memory grows with the number of GPU activities and launches (compact
columns, interned names), not with the size of the JSON (which is dominated by CPU ops and their
args). A truncated or corrupt file raises `UserError` naming the event number, the last good
event and the byte offset.

Decompressed input is bounded by what it inflates to, not by the file's size: the whole-file
path reads at most `ORJSON_MAX_BYTES` of JSON (a 1 MB gzip that inflates to 1 GB used to be
inflated whole, 2 GB RSS), and a gzip may inflate to at most `MAX_GZ_RATIO` x its size
(real Kineto traces inflate ~10-20x; `SERVELAB_TRACE_MAX_RATIO` raises the bound).
"""

from __future__ import annotations

import gzip
import io
import os
import re
import zlib
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servelab.errors import UserError

# Below this many bytes on disk (gz: compressed bytes) the whole file is parsed with orjson.
# Measured (docs/performance.md (profile section)): orjson is no faster per MB once events are ingested and
# holds ~10x the file in memory; streaming stays at ~20 MB RSS for any size.
ORJSON_MAX_BYTES = 16 << 20
ORJSON_MAX_GZ_BYTES = 2 << 20
# A gzip inflating beyond this many times its size is refused (a decompression bomb, not a
# trace); at least MIN_INFLATED_LIMIT is always allowed for tiny files.
MAX_GZ_RATIO = 200
MIN_INFLATED_LIMIT = 64 << 20
# The JSON parser's time grows with the square of one token's length (16 MB string: 2.6 s,
# 64 MB: ~40 s, measured here with ijson's C backend); a trace's longest value is a kernel name
# or a CPU op's args, kilobytes. A stretch this long without a quote is refused.
MAX_TOKEN_BYTES = 4 << 20

# Current Kineto names, and those of torch 1.8-1.12 ("Kernel", "Memcpy", "Runtime", ...).
GPU_CATEGORIES = {"kernel": 0, "gpu_memcpy": 1, "gpu_memset": 2, "Kernel": 0, "Memcpy": 1, "Memset": 2}
KIND_NAMES = ("kernel", "memcpy", "memset")
RUNTIME_CATEGORIES = ("cuda_runtime", "cuda_driver", "Runtime", "Driver")
GRAPH_LAUNCH_NAMES = frozenset({"cudaGraphLaunch", "cuGraphLaunch", "cudaGraphLaunch_v10000"})
# CPU-op names kept as annotations even without --step-regex (old torch: ProfilerStep is a cpu_op).
KNOWN_STEP_PREFIXES = ("ProfilerStep#", "step[", "execute_context_")
# Runtime/driver calls that steady-state serving never makes: a step holding one is warm-up
# (graph capture, a freshly compiled kernel's module load, the caching allocator growing).
# Kept with their times so that `phases.py` can name the cause (when the trace records them).
WARMUP_CALLS = frozenset({
    "cudaStreamBeginCapture", "cudaStreamEndCapture", "cudaGraphInstantiate",
    "cudaGraphInstantiateWithFlags", "cuStreamBeginCapture", "cuStreamEndCapture",
    "cuGraphInstantiate", "cuGraphInstantiateWithFlags",
    "cuModuleLoad", "cuModuleLoadData", "cuModuleLoadDataEx", "cuModuleLoadFatBinary",
    "cuLibraryLoadData", "cuLibraryLoadFromFile",
    "cudaMalloc", "cuMemAlloc", "cuMemAlloc_v2", "cuMemCreate",
})


@dataclass(frozen=True, slots=True)
class Annotation:
    """A named host- or GPU-side range (`ph: X`), e.g. `ProfilerStep#3` or `step[DECODE bs=1]`."""

    name: str
    ts_us: float
    dur_us: float
    gpu: bool  # gpu_user_annotation: drawn on the GPU timeline

    @property
    def end_us(self) -> float:
        return self.ts_us + self.dur_us


@dataclass(slots=True)
class Trace:
    """GPU activities, launches and annotations of one trace file, as compact columns.

    GPU activity i: name `names[name_idx[i]]`, start `ts_us[i]`, duration `dur_us[i]` on
    `device[i]`/`stream[i]`, launched by the runtime call with correlation id `corr[i]`
    (-1 unknown), kind `KIND_NAMES[kind[i]]`.
    """

    path: str
    names: list[str] = field(default_factory=list)
    name_idx: array = field(default_factory=lambda: array("i"))
    ts_us: array = field(default_factory=lambda: array("d"))
    dur_us: array = field(default_factory=lambda: array("d"))
    device: array = field(default_factory=lambda: array("i"))
    stream: array = field(default_factory=lambda: array("q"))
    corr: array = field(default_factory=lambda: array("q"))
    kind: array = field(default_factory=lambda: array("b"))
    # runtime calls (cudaLaunchKernel, cudaGraphLaunch, cudaMemcpyAsync, ...)
    rt_corr: array = field(default_factory=lambda: array("q"))
    rt_ts_us: array = field(default_factory=lambda: array("d"))
    rt_graph: array = field(default_factory=lambda: array("b"))
    annotations: list[Annotation] = field(default_factory=list)
    warmup_calls: list[tuple[str, float, float]] = field(default_factory=list)  # name, ts, dur
    n_events: int = 0
    device_properties: list[dict] = field(default_factory=list)

    @property
    def n_gpu(self) -> int:
        return len(self.ts_us)


class TooLarge(Exception):
    """The decompressed input passed its bound."""


class TokenTooLong(Exception):
    """One JSON value is longer than MAX_TOKEN_BYTES."""


def inflated_limit(path: Path, gz: bool) -> int | None:
    """How many bytes of JSON a trace file may hold once decompressed (None: not compressed)."""
    if not gz:
        return None
    try:
        ratio = float(os.environ.get("SERVELAB_TRACE_MAX_RATIO", MAX_GZ_RATIO))
    except ValueError:
        raise UserError("SERVELAB_TRACE_MAX_RATIO must be a number, e.g. 500") from None
    return max(MIN_INFLATED_LIMIT, int(ratio * path.stat().st_size))


class _CountingReader(io.RawIOBase):
    """Counts bytes handed to the JSON parser, so an error can name its byte offset, and stops
    at `limit` decompressed bytes."""

    def __init__(self, raw: Any, limit: int | None = None) -> None:
        self.raw = raw
        self.offset = 0
        self.limit = limit
        self.since_quote = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        data = self.raw.read(len(b))
        n = len(data)
        b[:n] = data
        self.offset += n
        if self.limit is not None and self.offset > self.limit:
            raise TooLarge(self.offset)
        q = data.rfind(b'"')
        self.since_quote = n - q - 1 if q >= 0 else self.since_quote + n
        if self.since_quote > MAX_TOKEN_BYTES:
            raise TokenTooLong(self.offset)
        return n


def _open_raw(path: Path):
    with open(path, "rb") as f:
        magic = f.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rb"), True
    return open(path, "rb"), False


def _first_char(path: Path) -> bytes:
    f, _ = _open_raw(path)
    with f:
        head = f.read(4096).lstrip()
    return head[:1]


class _Ingest:
    """Turns trace event dicts into the compact columns of a `Trace`."""

    def __init__(self, trace: Trace, keep_annotation: re.Pattern | None) -> None:
        self.t = trace
        self.keep = keep_annotation
        self.name_ids: dict[str, int] = {}
        self.last: Any = None

    def add(self, i: int, ev: Any) -> None:
        """Keep what the analysis needs from event #i; skip the rest cheaply (most are CPU ops)."""
        if type(ev) is not dict:
            raise UserError(
                f"{self.t.path}: event #{i} is a {type(ev).__name__}, not an object; "
                "this is not a Chrome/Kineto trace"
            )
        self.last = ev
        self.t.n_events = i + 1
        cat = ev.get("cat")
        if cat == "cpu_op" or cat == "python_function":
            name = ev.get("name")
            if type(name) is str and (
                name.startswith(KNOWN_STEP_PREFIXES) or (self.keep and self.keep.search(name))
            ) and ev.get("ph") == "X":
                ts, dur = self._times(i, ev, name)
                self.t.annotations.append(Annotation(name, ts, dur, gpu=False))
            return
        if ev.get("ph") != "X":
            return
        name = ev.get("name")
        if cat in GPU_CATEGORIES:
            ts, dur = self._times(i, ev, name)
            args = ev.get("args") or {}
            t = self.t
            nid = self.name_ids.get(name)
            if nid is None:
                nid = self.name_ids[name] = len(t.names)
                t.names.append(str(name))
            t.name_idx.append(nid)
            t.ts_us.append(ts)
            t.dur_us.append(dur)
            dev = args.get("device", ev.get("pid", 0))
            t.device.append(int(dev) if isinstance(dev, int | float) else 0)
            stream = args.get("stream", ev.get("tid", 0))
            t.stream.append(int(stream) if isinstance(stream, int | float) else 0)
            c = args.get("correlation", -1)
            t.corr.append(int(c) if isinstance(c, int | float) else -1)
            t.kind.append(GPU_CATEGORIES[cat])
        elif cat in RUNTIME_CATEGORIES:
            c = (ev.get("args") or {}).get("correlation")
            ts = ev.get("ts")
            if name in WARMUP_CALLS and isinstance(ts, int | float):
                d = ev.get("dur")
                self.t.warmup_calls.append((name, float(ts), float(d) if isinstance(d, int | float) else 0.0))
            if isinstance(c, int | float) and isinstance(ts, int | float):
                self.t.rt_corr.append(int(c))
                self.t.rt_ts_us.append(float(ts))
                self.t.rt_graph.append(1 if name in GRAPH_LAUNCH_NAMES else 0)
        elif (cat == "user_annotation" or cat == "gpu_user_annotation") and type(name) is str:
            ts, dur = self._times(i, ev, name)
            self.t.annotations.append(Annotation(name, ts, dur, gpu=(cat == "gpu_user_annotation")))

    def last_good(self) -> str:
        """The last event read whole, for error messages."""
        ev = self.last
        if not isinstance(ev, dict):
            return "none"
        return f"{str(ev.get('name'))[:80]!r} at ts={ev.get('ts')}"

    def _times(self, i: int, ev: dict, name: Any) -> tuple[float, float]:
        ts, dur = ev.get("ts"), ev.get("dur")
        if isinstance(ts, str):  # some exporters write numbers as strings
            ts = _num(ts)
        if isinstance(dur, str):
            dur = _num(dur)
        if not isinstance(ts, int | float) or not isinstance(dur, int | float):
            raise UserError(
                f"{self.t.path}: event #{i} ({ev.get('cat')} {str(name)[:80]!r}) has "
                f"ts={ev.get('ts')!r} dur={ev.get('dur')!r}; both must be numbers (microseconds)"
            )
        if dur < 0:
            raise UserError(
                f"{self.t.path}: event #{i} ({ev.get('cat')} {str(name)[:80]!r}) has a negative "
                f"duration {dur}; the trace is corrupt"
            )
        return float(ts), float(dur)


def _num(s: str) -> float | None:
    try:
        return float(s)
    except ValueError:
        return None


def read_trace(
    path: str | Path, step_regex: str | None = None, streaming: bool | None = None
) -> Trace:
    """Read a Kineto/Chrome trace (`.json` or `.json.gz`) into a `Trace`.

    `step_regex` also keeps CPU ops / python functions whose name matches it (user annotations
    are always kept). `streaming` forces (True) or forbids (False) the ijson path; by default
    files above `ORJSON_MAX_BYTES` (gz: `ORJSON_MAX_GZ_BYTES`) stream.
    """
    p = Path(path)
    if not p.is_file():
        raise UserError(f"trace file {p} does not exist (pass a .json or .json.gz trace)")
    try:
        keep = re.compile(step_regex) if step_regex else None
    except re.error as exc:
        raise UserError(f"--step-regex {step_regex!r} is not a valid regular expression: {exc}") from None
    size = p.stat().st_size
    if size == 0:
        raise UserError(f"{p}: the trace file is empty")
    with open(p, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    if streaming is None:
        streaming = size > (ORJSON_MAX_GZ_BYTES if gz else ORJSON_MAX_BYTES)
    trace = Trace(path=str(p))
    ing = _Ingest(trace, keep)
    doc = None
    if not streaming:
        try:
            doc = _load_whole(p, gz)
        except (ValueError, EOFError, OSError, zlib.error):
            streaming = True  # re-read streaming: it names the event and offset of the damage
        if doc is None:
            streaming = True  # inflates past what is parsed whole: stream it (bounded memory)
        else:
            events = doc.get("traceEvents") if isinstance(doc, dict) else doc
            if not isinstance(events, list):
                raise UserError(f"{p}: no 'traceEvents' list; this is not a Chrome/Kineto trace")
            if isinstance(doc, dict) and isinstance(doc.get("deviceProperties"), list):
                trace.device_properties = doc["deviceProperties"]
            for i, ev in enumerate(events):
                ing.add(i, ev)
            return trace
    _stream(p, ing)
    return trace


def _load_whole(p: Path, gz: bool) -> Any:
    """The parsed document, or None when the JSON is larger than ORJSON_MAX_BYTES."""
    import orjson

    if gz:
        with gzip.open(p, "rb") as f:
            data = f.read(ORJSON_MAX_BYTES + 1)
        if len(data) > ORJSON_MAX_BYTES:
            return None
    else:
        data = p.read_bytes()
    return orjson.loads(data)


def _stream(p: Path, ing: _Ingest) -> None:
    import ijson

    i = -1
    prefix = "traceEvents.item"
    counter = _CountingReader(io.BytesIO())
    try:  # a damaged gzip header or an empty gzip stream fails already here
        prefix = "item" if _first_char(p) == b"[" else "traceEvents.item"
        raw, gz = _open_raw(p)
        counter = _CountingReader(raw, inflated_limit(p, gz))
        buffered = io.BufferedReader(counter, buffer_size=1 << 20)
        with raw:
            for i, ev in enumerate(ijson.items(buffered, prefix, use_float=True)):
                ing.add(i, ev)
    except UserError:
        raise
    except TokenTooLong:
        raise UserError(
            f"{p}: more than {MAX_TOKEN_BYTES >> 20} MiB without a quote near byte "
            f"{counter.offset:,} of the JSON: one value that long is not a trace's (kernel "
            "names and op args are kilobytes); this file is not a Kineto trace"
        ) from None
    except TooLarge:
        raise UserError(
            f"{p}: inflates to more than {counter.limit:,} bytes, {MAX_GZ_RATIO}x its "
            f"{p.stat().st_size:,} compressed bytes: a decompression bomb, not a trace; if it "
            "is a real trace, set SERVELAB_TRACE_MAX_RATIO higher"
        ) from None
    except (ijson.JSONError, EOFError, OSError, zlib.error, ValueError) as exc:
        last = f"last good event #{i}: {ing.last_good()}" if i >= 0 else "no event read whole"
        what = "truncated" if _looks_truncated(exc) else "corrupt"
        raise UserError(
            f"{p}: the trace is {what} at event #{i + 1} (about byte {counter.offset:,} of the "
            f"JSON; {last}): {' '.join(str(exc).split())[:160]}. "
            "Re-export the trace, or copy the whole file"
        ) from None
    if i < 0 and ing.t.n_events == 0:
        raise UserError(
            f"{p}: no trace events found under '{prefix.split('.')[0]}'; this is not a "
            "Chrome/Kineto trace"
        )


def _looks_truncated(exc: BaseException) -> bool:
    msg = str(exc).lower()
    return isinstance(exc, EOFError) or "incomplete" in msg or "premature" in msg or "end" in msg


def launch_times(trace: Trace) -> dict[int, tuple[float, bool]]:
    """Correlation id -> (host launch time, launched by a CUDA-graph launch)."""
    return {
        c: (t, bool(g))
        for c, t, g in zip(trace.rt_corr, trace.rt_ts_us, trace.rt_graph, strict=True)
    }

