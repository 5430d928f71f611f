"""The engine's /metrics as time series over a load point: a scraper in a thread reads the
Prometheus endpoint every `interval_s` (1 s by default) and keeps, per scrape, the values of
the vocabulary (vocabulary.py) that the server serves. A series the server does not serve is
None in every sample, never 0; a failed scrape is a sample with every value None and its error.

Cost: one keep-alive HTTP GET and a line scan that keeps only the vocabulary's names (no
prometheus_client parser: it builds every histogram bucket). The scraper's own CPU time is
measured (`time.thread_time`) and stored with the series; benchmarks/bench_telemetry_scrape.py
measures it against a vLLM-sized /metrics page.
"""

from __future__ import annotations

import http.client
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from servelab.telemetry.vocabulary import BY_NAME, ENGINE_NAMES, SERIES

DEFAULT_INTERVAL_S = 1.0
MAX_BODY = 32 << 20  # a /metrics page larger than this is not a metrics page


def parse(text: str) -> dict[str, list[float]]:
    """The samples of the vocabulary's engine names in a Prometheus text page: name (without
    `_total`) -> one value per label set. Other names, comments and malformed lines are
    skipped; `_bucket`/`_sum`/`_count` never match a vocabulary name."""
    out: dict[str, list[float]] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        if brace >= 0:
            name = line[:brace]
            end = line.rfind("}")
            rest = line[end + 1:].split() if end > brace else []
        else:
            name, _, tail = line.partition(" ")
            rest = tail.split()
        if name.endswith("_total"):
            name = name[:-6]
        if name not in ENGINE_NAMES or not rest:
            continue
        try:
            v = float(rest[0])
        except ValueError:
            continue
        if v == v:  # NaN: the server has no value yet
            out.setdefault(name, []).append(v)
    return out


def values(raw: dict[str, list[float]]) -> tuple[dict[str, float | None], dict[str, str]]:
    """Our vocabulary's values from parsed engine samples, and which engine name gave each
    (the first of a series' names that the page holds)."""
    vals: dict[str, float | None] = {}
    src: dict[str, str] = {}
    for s in SERIES:
        vals[s.name] = None
        for n in s.engine_names:
            xs = raw.get(n)
            if xs:
                vals[s.name] = sum(xs) if s.agg == "sum" else sum(xs) / len(xs)
                src[s.name] = n
                break
    return vals, src


@dataclass(slots=True)
class ServerSeries:
    """Scrapes of one endpoint: `t_s` seconds after the scraper started (monotonic), `values`
    per vocabulary name (None: not served, or the scrape failed), `errors` per sample (None
    when it succeeded), `sources` the engine names read, `cpu_s` the scraper thread's CPU."""

    url: str
    interval_s: float
    t_s: list[float] = field(default_factory=list)
    values: dict[str, list[float | None]] = field(
        default_factory=lambda: {s.name: [] for s in SERIES})
    errors: list[str | None] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)
    cpu_s: float = 0.0
    wall_s: float = 0.0

    def add(self, t: float, vals: dict[str, float | None] | None, error: str | None = None,
            src: dict[str, str] | None = None) -> None:
        self.t_s.append(t)
        self.errors.append(error)
        for name, col in self.values.items():
            col.append(None if vals is None else vals.get(name))
        if src:
            self.sources.update(src)

    def gauge(self, name: str) -> list[float | None]:
        """A level over time (running_requests, queued_requests, kv_cache_usage, ...)."""
        return list(self.values[name])

    def rate(self, name: str) -> list[float | None]:
        """A counter's increase per second over each interval (one fewer than the samples):
        None where either end is missing or the counter went down (the server restarted)."""
        if BY_NAME[name].kind != "counter":
            raise ValueError(f"{name} is a gauge; rates are of counters: "
                             f"{', '.join(s.name for s in SERIES if s.kind == 'counter')}")
        col, out = self.values[name], []
        for i in range(1, len(col)):
            a, b, dt = col[i - 1], col[i], self.t_s[i] - self.t_s[i - 1]
            out.append(None if a is None or b is None or b < a or dt <= 0 else (b - a) / dt)
        return out

    def ratio(self, num: str, den: str, i: int, j: int) -> float | None:
        """d(num) / d(den) between samples i and j; None when missing, reset or d(den) == 0."""
        a0, a1 = self.values[num][i], self.values[num][j]
        b0, b1 = self.values[den][i], self.values[den][j]
        if None in (a0, a1, b0, b1) or a1 < a0 or b1 <= b0:  # type: ignore[operator]
            return None
        return (a1 - a0) / (b1 - b0)  # type: ignore[operator]

    def window(self, i: int = 0, j: int | None = None) -> dict[str, float | None]:
        """Derived values between samples i and j (default: first and last): token rates,
        prefix-cache hit rate (counters, else the server's gauge at j), acceptance."""
        j = len(self.t_s) - 1 if j is None else j
        if j <= i:
            return {}
        dt = self.t_s[j] - self.t_s[i]
        out: dict[str, float | None] = {}
        for name, key in (("generation_tokens", "output_tok_s"), ("prompt_tokens", "input_tok_s")):
            a, b = self.values[name][i], self.values[name][j]
            out[key] = (b - a) / dt if a is not None and b is not None and b >= a else None
        hit = self.ratio("prefix_cache_hits", "prefix_cache_queries", i, j)
        out["prefix_cache_hit_rate"] = hit if hit is not None else \
            self.values["prefix_cache_hit_rate_gauge"][j]
        acc = self.ratio("spec_accepted_tokens", "spec_drafts", i, j)
        out["spec_accept_length"] = 1.0 + acc if acc is not None else \
            self.values["spec_accept_length_gauge"][j]
        rate = self.ratio("spec_accepted_tokens", "spec_draft_tokens", i, j)
        out["spec_accept_rate"] = rate if rate is not None else \
            self.values["spec_accept_rate_gauge"][j]
        return out

    @property
    def cpu_share(self) -> float | None:
        """The scraper's CPU time over its wall time (a fraction of one core)."""
        return self.cpu_s / self.wall_s if self.wall_s > 0 else None

    def to_json(self) -> dict[str, Any]:
        """Columnar: `t_s` and one list per served name (names never served are left out)."""
        served = {k: v for k, v in self.values.items() if any(x is not None for x in v)}
        return {"url": self.url, "interval_s": self.interval_s, "t_s": self.t_s,
                "series": served, "sources": self.sources,
                "failed_scrapes": sum(e is not None for e in self.errors),
                "errors": sorted({e for e in self.errors if e})[:5],
                "cpu_s": self.cpu_s, "wall_s": self.wall_s, "cpu_share": self.cpu_share}


class _Fetcher:
    """GET one URL over a kept-alive connection (reopened after any error)."""

    def __init__(self, url: str, timeout_s: float,
                 headers: dict[str, str] | None = None) -> None:
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"metrics URL must be http(s)://host[:port]/path, got {url!r}")
        self.scheme, self.host, self.port = u.scheme, u.hostname, u.port
        self.path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        self.timeout_s = timeout_s
        self.headers = dict(headers or {})
        self.conn: http.client.HTTPConnection | None = None

    def get(self) -> str:
        if self.conn is None:
            cls = http.client.HTTPSConnection if self.scheme == "https" else \
                http.client.HTTPConnection
            self.conn = cls(self.host, self.port, timeout=self.timeout_s)
        try:
            self.conn.request("GET", self.path, headers=self.headers)
            r = self.conn.getresponse()
            body = r.read(MAX_BODY + 1)
        except (OSError, http.client.HTTPException):
            self.close()
            raise
        if r.status != 200:
            raise http.client.HTTPException(f"HTTP {r.status}")
        if len(body) > MAX_BODY:
            self.close()
            raise http.client.HTTPException(f"/metrics larger than {MAX_BODY} bytes")
        return body.decode("utf-8", errors="replace")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class Scraper:
    """Scrape `url` every `interval_s` in a daemon thread between start() and stop() (or as a
    context manager); `series` holds what was read. `headers` go with every GET (the bench's
    Authorization: a server or proxy may guard /metrics with the API key). The ticks keep to a fixed grid (t0 + k *
    interval): a slow scrape shifts no later tick, and a tick missed entirely is skipped."""

    def __init__(self, url: str, interval_s: float = DEFAULT_INTERVAL_S,
                 timeout_s: float | None = None, headers: dict[str, str] | None = None) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.fetcher = _Fetcher(url, timeout_s if timeout_s is not None else max(interval_s, 1.0),
                                headers)
        self.series = ServerSeries(url=url, interval_s=interval_s)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.t0 = 0.0  # time.monotonic() at start: the series' times are seconds after it

    def start(self) -> Scraper:
        if self._thread is not None:
            raise RuntimeError("scraper already started")
        self.t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="metrics-scraper", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> ServerSeries:
        """Stop after one last scrape (so the series covers the end of the load point)."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(self.fetcher.timeout_s + 5)
        return self.series

    def __enter__(self) -> Scraper:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def scrape_once(self) -> None:
        t = time.monotonic() - self.t0
        try:
            vals, src = values(parse(self.fetcher.get()))
        except (OSError, http.client.HTTPException, ValueError) as exc:
            self.series.add(t, None, error=f"{type(exc).__name__}: {exc}"[:200])
            return
        self.series.add(t, vals, src=src)

    def _run(self) -> None:
        c0 = time.thread_time()
        k = 0
        try:
            while True:
                self.scrape_once()
                if self._stop.is_set():
                    break
                k = max(k + 1, int((time.monotonic() - self.t0) / self.series.interval_s) + 1)
                self._stop.wait(max(0.0, self.t0 + k * self.series.interval_s - time.monotonic()))
                if self._stop.is_set():
                    self.scrape_once()
                    break
        finally:
            self.fetcher.close()
            self.series.cpu_s = time.thread_time() - c0
            self.series.wall_s = time.monotonic() - self.t0
