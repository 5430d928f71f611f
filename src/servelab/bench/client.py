"""The streaming client: one request in, timestamped token events out.

Backends differ only in how a request body is built and how one SSE `data:` payload is read;
the streaming loop, the clock and the failure taxonomy are written once here. No latency metric
is computed in this module (that is `metrics.py`): a request yields its raw facts, the token
events `(t_ns, n_tokens | None, text)` as the client saw them: `time.perf_counter_ns()`
(CLOCK_MONOTONIC) when the event's last byte was fed from the socket to aiohttp.

Failure reasons (`RawResult.error`): `http_<status>`, `timeout`, `connect_error`,
`connection_lost`, `malformed_sse`, `server_error` (an error object inside the stream),
`no_end_marker` (the stream closed without `data: [DONE]`), `empty_output` (no content token).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from servelab.bench.workload import RequestSpec

Event = tuple[int, int | None, str]  # (t_ns, n_tokens or None when the API does not say, text)


@dataclass(slots=True)
class RawResult:
    """What one request did, before any metric is derived."""

    index: int
    t_start_ns: int
    t_end_ns: int = 0
    events: list[Event] = field(default_factory=list)
    error: str | None = None
    error_detail: str | None = None
    http_status: int | None = None
    end_marker: bool = False
    prompt_tokens: int | None = None
    completion_tokens: int | None = None  # from the server (usage / meta_info), else None
    spec_verify_ct: int | None = None
    response_id: str | None = None
    warmup: bool = False
    cached_tokens: int | None = None  # prompt tokens the server reused (usage / meta_info)
    t_due_ns: int | None = None  # open loop: when the schedule wanted it sent (load.py)


class _Malformed(Exception):
    pass


class _TimedReader(aiohttp.StreamReader):
    """aiohttp's payload reader, noting when each piece of payload is fed from the socket.

    Why: with many streams, the event loop reads all ready sockets first (cheap) and only then
    runs the tasks that parse them (~tens of us each), so a time taken in the parsing task lags
    by the work queued before it - about 3 ms for the last of 64 streams that tick together, as
    engines' batched decode steps do. The feed time is the moment the bytes left the kernel.
    Same memory layout as StreamReader (no new slots), so an instance's class can be swapped."""

    __slots__ = ()

    def feed_data(self, data: bytes, size: int = 0) -> bool:  # type: ignore[override]
        a = _LIVE.get(id(self))
        if a is not None and data:
            a.total += len(data)
            a.marks.append((a.total, _now_ns()))
        return _feed(self, data, size)


_feed = aiohttp.StreamReader.feed_data
_now_ns = time.perf_counter_ns


class _Arrivals:
    """Feed times of one response's payload, by stream offset."""

    __slots__ = ("key", "t_attach", "start", "total", "marks", "i")

    def __init__(self, key: int, start: int) -> None:
        self.key = key
        self.t_attach = time.perf_counter_ns()
        self.start = self.total = start  # bytes fed before we attached arrived before t_attach
        self.marks: list[tuple[int, int]] = []  # (stream offset after the piece, feed time)
        self.i = 0

    @classmethod
    def attach(cls, reader: aiohttp.StreamReader) -> _Arrivals | None:
        if type(reader) is not aiohttp.StreamReader:
            return None  # someone else's reader: fall back to read times
        a = cls(id(reader), reader.total_bytes)
        reader.__class__ = _TimedReader
        _LIVE[a.key] = a
        return a

    def detach(self) -> None:
        _LIVE.pop(self.key, None)

    def time_at(self, offset: int) -> int:
        """When the byte just before `offset` arrived (offsets only grow between calls)."""
        if offset <= self.start:
            return self.t_attach
        marks, i = self.marks, self.i
        last = len(marks) - 1
        while i < last and marks[i][0] < offset:
            i += 1
        self.i = i
        return marks[i][1] if marks else self.t_attach


_LIVE: dict[int, _Arrivals] = {}


class Client:
    """Sends requests of one API (`completions`, `chat`, `sglang`) to one server, sharing one
    aiohttp session (connection reuse, no per-request set-up)."""

    def __init__(self, session: aiohttp.ClientSession, root_url: str, api: str, model: str | None,
                 timeout_s: float) -> None:
        self.session = session
        self.api = api
        self.model = model
        self.timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=min(timeout_s, 30.0))
        path = {"completions": "/v1/completions", "chat": "/v1/chat/completions",
                "sglang": "/generate"}[api]
        self.url = root_url + path

    def body(self, spec: RequestSpec) -> dict[str, Any]:
        """The request body: fixed output length via max_tokens + ignore_eos + min_tokens."""
        n = spec.output_len
        if self.api == "sglang":
            return {"text": spec.prompt, "stream": True,
                    "sampling_params": {"max_new_tokens": n, "min_new_tokens": n,
                                        "ignore_eos": True, "temperature": 0.0}}
        b: dict[str, Any] = {"max_tokens": n, "min_tokens": n, "ignore_eos": True,
                             "temperature": 0.0, "stream": True,
                             "stream_options": {"include_usage": True}}
        if self.model:
            b["model"] = self.model
        if self.api == "chat":  # a session's turn carries its history (workload.py)
            b["messages"] = [*({"role": r, "content": c} for r, c in spec.history),
                             {"role": "user", "content": spec.prompt}]
        else:
            b["prompt"] = spec.prompt
        return b

    async def send(self, spec: RequestSpec, warmup: bool = False) -> RawResult:
        """Send one request and stream its answer; never raises for a failed request."""
        data = orjson.dumps(self.body(spec))
        res = RawResult(index=spec.index, t_start_ns=time.perf_counter_ns(), warmup=warmup)
        try:
            async with self.session.post(self.url, data=data, timeout=self.timeout,
                                         headers={"Content-Type": "application/json"}) as resp:
                res.http_status = resp.status
                if resp.status != 200:
                    body = await resp.content.read(2000)
                    res.error = f"http_{resp.status}"
                    res.error_detail = body.decode(errors="replace")[:300]
                else:
                    await self._stream(resp, res)
        except _Malformed as exc:
            res.error, res.error_detail = "malformed_sse", str(exc)[:300]
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            res.error, res.error_detail = "timeout", f"no complete answer within {self.timeout.total} s {exc}".strip()
        except aiohttp.ClientConnectorError as exc:
            res.error, res.error_detail = "connect_error", str(exc)[:300]
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError,
                aiohttp.ClientOSError) as exc:
            res.error, res.error_detail = "connection_lost", f"{type(exc).__name__}: {exc}"[:300]
        except aiohttp.ClientError as exc:
            res.error, res.error_detail = "client_error", f"{type(exc).__name__}: {exc}"[:300]
        except (KeyError, TypeError, AttributeError, IndexError, ValueError) as exc:
            # a payload of an unexpected shape (e.g. choices[0] not an object): this request
            # failed, the run goes on
            res.error, res.error_detail = "malformed_sse", f"{type(exc).__name__}: {exc}"[:300]
        if not res.end_marker or res.error is not None:
            res.t_end_ns = time.perf_counter_ns()  # else: when [DONE] arrived
        if res.error is None:
            if not res.end_marker:
                res.error = "no_end_marker"
                res.error_detail = "the stream closed without data: [DONE]"
            elif not res.events:
                res.error = "empty_output"
                res.error_detail = "the stream carried no content token"
        return res

    async def _stream(self, resp: aiohttp.ClientResponse, res: RawResult) -> None:
        """Read SSE lines; every `data:` payload is handled by the API's reader and stamped with
        the time its last byte came off the socket (see `_Arrivals`)."""
        handle = self._sglang_payload if self.api == "sglang" else self._openai_payload
        state: dict[str, Any] = {"text": "", "ct": 0}
        content = resp.content
        arr = _Arrivals.attach(content)
        buf = b""
        consumed = 0  # stream offset of buf[0]
        try:
            while True:
                chunk = await content.readany()
                if not chunk:
                    break
                t_read = time.perf_counter_ns()
                buf = buf + chunk if buf else chunk
                if b"\n" not in chunk:
                    continue
                lines = buf.split(b"\n")
                rest = lines.pop()
                off = consumed
                for line in lines:
                    off += len(line) + 1
                    if not line or not line.startswith(b"data:"):
                        continue  # blank separators, comments, event:/id: fields
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        res.end_marker = True
                        res.t_end_ns = arr.time_at(off) if arr else t_read
                        continue
                    try:
                        obj = orjson.loads(payload)
                    except orjson.JSONDecodeError:
                        raise _Malformed(f"undecodable data line: {payload[:120]!r}") from None
                    if not isinstance(obj, dict):
                        raise _Malformed(f"data line is not a JSON object: {payload[:120]!r}")
                    handle(obj, arr.time_at(off) if arr else t_read, res, state)
                    if res.error is not None:
                        return
                consumed = off
                buf = rest
        finally:
            if arr:
                arr.detach()

    @staticmethod
    def _openai_payload(obj: dict[str, Any], t: int, res: RawResult, state: dict[str, Any]) -> None:
        if "error" in obj and not obj.get("choices"):
            res.error, res.error_detail = "server_error", str(obj["error"])[:300]
            return
        choices = obj.get("choices")
        if choices:
            c = choices[0]
            delta = c.get("delta")
            if delta is not None:
                text = (delta.get("content") or "") + (delta.get("reasoning_content") or "")
            else:
                text = c.get("text") or ""
            if text:
                res.events.append((t, None, text))
        usage = obj.get("usage")
        if usage:
            res.completion_tokens = usage.get("completion_tokens", res.completion_tokens)
            res.prompt_tokens = usage.get("prompt_tokens", res.prompt_tokens)
            # vLLM (--enable-prompt-tokens-details) and SGLang (--enable-cache-report); vLLM
            # leaves prompt_tokens_details out when nothing was cached (docs/METRICS.md)
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
                res.cached_tokens = details["cached_tokens"]
        if res.response_id is None:
            res.response_id = obj.get("id")

    @staticmethod
    def _sglang_payload(obj: dict[str, Any], t: int, res: RawResult, state: dict[str, Any]) -> None:
        if "error" in obj and "text" not in obj:
            res.error, res.error_detail = "server_error", str(obj["error"])[:300]
            return
        text = obj.get("text") or ""
        prev = state["text"]
        delta = text[len(prev):] if text.startswith(prev) else text  # cumulative or incremental
        state["text"] = text if text.startswith(prev) else prev + text
        meta = obj.get("meta_info") or {}
        ct = meta.get("completion_tokens")
        n: int | None = None
        if isinstance(ct, int):
            n = ct - state["ct"]
            state["ct"] = ct
            res.completion_tokens = ct
        if (n is not None and n > 0) or (n is None and delta):
            res.events.append((t, n, delta))
        if isinstance(meta.get("prompt_tokens"), int):
            res.prompt_tokens = meta["prompt_tokens"]
        if isinstance(meta.get("spec_verify_ct"), int):
            res.spec_verify_ct = meta["spec_verify_ct"]
        if isinstance(meta.get("cached_tokens"), int):  # SGLang's /generate, always reported
            res.cached_tokens = meta["cached_tokens"]
        if res.response_id is None:
            res.response_id = meta.get("id")


async def get_json(session: aiohttp.ClientSession, url: str, timeout_s: float = 10.0,
                   method: str = "GET", body: Any = None) -> Any | None:
    """A JSON answer, or None when the server does not serve it (any error)."""
    try:
        async with session.request(method, url, json=body,
                                   timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            if r.status != 200:
                return None
            return orjson.loads(await r.read())
    except (TimeoutError, aiohttp.ClientError, orjson.JSONDecodeError, ValueError):
        return None


async def get_text(session: aiohttp.ClientSession, url: str, timeout_s: float = 10.0) -> str | None:
    """A text answer (e.g. Prometheus /metrics), or None on any error."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            if r.status != 200:
                return None
            return await r.text()
    except (TimeoutError, aiohttp.ClientError, UnicodeDecodeError):
        return None
