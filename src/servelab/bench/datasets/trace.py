"""Production traces read as rows on the file's own clock: arrival time, input and output token
counts, and where the trace has them, the prompt's block hashes and its session.

Formats (detected from the file's first line; `--trace-format` forces one), with the columns and
units of the published traces (docs/EXPERIMENTS.md says where to get them):

- `mooncake` (Mooncake FAST'25, kvcache-ai/Mooncake `FAST25-release/traces/*.jsonl`): JSONL of
  `timestamp` (milliseconds), `input_length`, `output_length`, `hash_ids` (one id per block of
  512 tokens; equal ids are equal blocks, chained: an id at position i implies the same prefix).
  SGLang's `--dataset-name mooncake`, vLLM's and AIPerf's `mooncake_trace` read the same keys.
- `bailian` (Qwen Bailian, alibaba-edu/qwen-bailian-usagetraces-anon): JSONL of `chat_id`,
  `parent_chat_id` (-1 for a first turn), `timestamp` (SECONDS, float), `input_length`,
  `output_length`, `type`, `turn`, `hash_ids` (blocks of 16 tokens).
- `azure` (Azure LLM inference traces 2023 and 2024, Azure/AzurePublicDataset
  `AzureLLMInferenceTrace_{code,conv}*.csv`): CSV of `TIMESTAMP` (a date and time, e.g.
  `2023-11-16 18:17:03.9799600`, optionally with a UTC offset), `ContextTokens`,
  `GeneratedTokens`.
- `burstgpt` (BurstGPT, HPMLL/BurstGPT `data/BurstGPT_*.csv`): CSV of `Timestamp` (seconds),
  `Model`, `Request tokens`, `Response tokens`, `Total tokens`, `Log Type`. Rows whose
  `Response tokens` is 0 are failed requests in the original service (the README says so) and
  are skipped, as vLLM's BurstGPT loader does; the count skipped is reported.

The window: requests whose time since the file's first request is in [start, start + duration),
at most `cap` of them, due at (t - t_first_in_window) / speed: speed 2 replays twice as fast
(SGLang's --mooncake-slowdown-factor is the inverse). Files are read in order and reading stops
once the window is full, so a 5-million-row BurstGPT file costs only the rows it needs.
"""

from __future__ import annotations

import csv
import datetime as dt
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson

from servelab.errors import UserError

FORMATS = ("mooncake", "bailian", "azure", "burstgpt")
# 16M tokens: past any model's context; a larger count is a broken file, refused before a prompt
# of that size is built in memory
MAX_TOKENS = 1 << 24
BLOCK_SIZE = {"mooncake": 512, "bailian": 16}
_AZURE = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_BURST = ("Timestamp", "Request tokens", "Response tokens")
_EPOCH = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
_DATETIME = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?"
                       r"\s*(Z|[+-]\d{2}:?\d{2})?$")


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One request of a trace: `t_s` on the file's clock (seconds), token counts, block hashes
    (empty where the format has none), the session's id and the turn, where it says."""

    t_s: float
    input_len: int
    output_len: int
    hash_ids: tuple[int, ...] = ()
    chat_id: int | None = None
    parent_chat_id: int | None = None
    turn: int | None = None


@dataclass(frozen=True, slots=True)
class TraceWindow:
    """The rows to replay, each with its due time (seconds after the load point starts)."""

    format: str
    rows: tuple[TraceRow, ...]
    arrivals_s: tuple[float, ...]
    skipped: int  # rows dropped: failed requests (BurstGPT, 0 output tokens), 0 input tokens
    read: int  # rows read from the file


def detect_format(path: str) -> str:
    """The format of a trace file, from its first line."""
    try:
        with open(path, encoding="utf-8-sig") as f:
            first = f.readline().strip()
    except OSError as exc:
        raise UserError(f"--dataset-path {path}: cannot read ({exc.strerror})") from None
    if first.startswith("{"):
        try:
            obj = orjson.loads(first)
        except orjson.JSONDecodeError:
            raise UserError(f"--dataset-path {path}: the first line is not JSON") from None
        if "chat_id" in obj or "turn" in obj:
            return "bailian"
        if "input_length" in obj:
            return "mooncake"
        raise UserError(f"--dataset-path {path}: a JSONL trace needs timestamp, input_length, "
                        f"output_length (Mooncake) or chat_id/turn too (Bailian); got keys "
                        f"{sorted(obj)}")
    cols = [c.strip() for c in first.split(",")]
    if all(c in cols for c in _AZURE):
        return "azure"
    if all(c in cols for c in _BURST):
        return "burstgpt"
    raise UserError(f"--dataset-path {path}: not a known trace: Mooncake/Bailian JSONL, an Azure "
                    f"CSV ({', '.join(_AZURE)}) or a BurstGPT CSV ({', '.join(_BURST)}); "
                    f"first line {first[:120]!r}")


def azure_seconds(text: str) -> float:
    """An Azure trace TIMESTAMP as seconds since 2020-01-01 UTC (UTC unless an offset is
    given). 7 fractional digits (100 ns) are kept: datetime alone cuts to 6, and seconds since
    1970 in a float step by 240 ns; since 2020 they step by 15 ns until 2030."""
    m = _DATETIME.match(text.strip())
    if m is None:
        raise ValueError(f"not a date and time: {text!r}")
    y, mo, d, h, mi, s = (int(m.group(i)) for i in range(1, 7))
    base = (dt.datetime(y, mo, d, h, mi, s, tzinfo=dt.UTC) - _EPOCH).total_seconds()
    frac = float("0." + m.group(7)) if m.group(7) else 0.0
    tz = m.group(8)
    if tz and tz != "Z":
        sign = -1 if tz[0] == "-" else 1
        hh, mm = int(tz[1:3]), int(tz[-2:])
        base -= sign * (hh * 3600 + mm * 60)
    return base + frac


def _json_rows(path: str, fmt: str) -> Iterator[TraceRow]:
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                o = orjson.loads(line)
                ts = float(o["timestamp"])
                yield TraceRow(
                    t_s=ts / 1000.0 if fmt == "mooncake" else ts,  # ms vs seconds
                    input_len=int(o["input_length"]), output_len=int(o["output_length"]),
                    hash_ids=tuple(int(h) for h in o.get("hash_ids") or ()),
                    chat_id=int(o["chat_id"]) if o.get("chat_id") is not None else None,
                    parent_chat_id=(int(o["parent_chat_id"])
                                    if o.get("parent_chat_id") is not None else None),
                    turn=int(o["turn"]) if o.get("turn") is not None else None)
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                raise UserError(f"--dataset-path {path}: line {n} is not a {fmt} record "
                                f"({type(exc).__name__}: {exc})") from None


def _csv_rows(path: str, fmt: str) -> Iterator[TraceRow | None]:
    """Rows of a CSV trace; None for a row that is a failed request (BurstGPT)."""
    with open(path, newline="", encoding="utf-8-sig") as f:
        for n, rec in enumerate(csv.DictReader(f), 2):
            try:
                if fmt == "azure":
                    yield TraceRow(t_s=azure_seconds(rec["TIMESTAMP"]),
                                   input_len=int(rec["ContextTokens"]),
                                   output_len=int(rec["GeneratedTokens"]))
                else:
                    out = int(float(rec["Response tokens"]))
                    inp = int(float(rec["Request tokens"]))
                    yield (TraceRow(t_s=float(rec["Timestamp"]), input_len=inp, output_len=out)
                           if out > 0 and inp > 0 else None)
            except (KeyError, TypeError, ValueError) as exc:
                raise UserError(f"--dataset-path {path}: line {n} is not a {fmt} row "
                                f"({type(exc).__name__}: {exc})") from None


def read_window(path: str, fmt: str | None = None, start_s: float = 0.0,
                duration_s: float | None = None, speed: float = 1.0,
                cap: int | None = None) -> TraceWindow:
    """The rows of `path` in the window (module docstring), in time order, with due times."""
    if not Path(path).is_file():
        raise UserError(f"--dataset-path {path}: no such file; pass a trace file "
                        "(examples/traces/ holds one of each format)")
    fmt = fmt or detect_format(path)
    if fmt not in FORMATS:
        raise UserError(f"--trace-format {fmt!r} is not one of {', '.join(FORMATS)}")
    source = _json_rows(path, fmt) if fmt in BLOCK_SIZE else _csv_rows(path, fmt)
    end = start_s + duration_s if duration_s is not None else float("inf")
    t_first: float | None = None
    ordered = True
    prev = -float("inf")
    kept: list[TraceRow] = []
    skipped = read = in_window = 0
    for row in source:
        read += 1
        if row is None or row.input_len < 1:  # a failed request, or nothing to send
            skipped += 1
            continue
        if not math.isfinite(row.t_s) or not 0 <= row.output_len <= MAX_TOKENS \
                or row.input_len > MAX_TOKENS:
            raise UserError(f"--dataset-path {path}: row {read}: timestamp {row.t_s}, "
                            f"input {row.input_len}, output {row.output_len} tokens: a timestamp "
                            f"must be finite and token counts within 0..{MAX_TOKENS}")
        if t_first is None:
            t_first = row.t_s
        if row.t_s < prev:
            ordered = False  # then every row must be read: the window is known only at the end
        prev = max(prev, row.t_s)
        if ordered and row.t_s - t_first >= end:
            break
        kept.append(row)
        in_window += row.t_s - t_first >= start_s
        if ordered and cap is not None and in_window >= cap:
            break
    if t_first is None:
        raise UserError(f"--dataset-path {path}: no request in the file")
    t0 = min(r.t_s for r in kept) if kept else t_first
    rows = sorted((r for r in kept if start_s <= r.t_s - t0 < end), key=lambda r: r.t_s)
    if cap is not None:
        rows = rows[:cap]
    if not rows:
        raise UserError(f"--dataset-path {path}: no request in the window --trace-start "
                        f"{start_s:g} s, --trace-duration {duration_s} s")
    first = rows[0].t_s
    return TraceWindow(format=fmt, rows=tuple(rows),
                       arrivals_s=tuple((r.t_s - first) / speed for r in rows),
                       skipped=skipped, read=read)
