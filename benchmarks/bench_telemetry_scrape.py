"""CPU cost of scraping an engine's /metrics during a load point (src/servelab/telemetry/
server.py), as a share of one client core: the issue's budget is < 1% at the 1-s default.

The page is vLLM-sized: the vocabulary's series plus `--histograms` histogram families of
`--buckets` buckets for `--engines` data-parallel engines (vLLM 0.10 on one model serves ~25
histograms of 10-40 buckets: ~100-200 KB), served by a separate process so that only the
scraper's CPU is counted. The scraper measures its own thread's CPU (time.thread_time).

Two measurements:
- per scrape: `--fast` scrapes back to back (interval 1 ms): CPU ms per scrape, page parsed;
- at the interval: `--seconds` at `--interval` (1 s default): the thread's CPU / wall time.

Run:  .venv/bin/python benchmarks/bench_telemetry_scrape.py [--seconds 30] [--interval 1]
      [--histograms 25] [--buckets 30] [--engines 2] [--fast 300]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from servelab.telemetry.server import Scraper

SERVE = """
import http.server, sys
body = open(sys.argv[1], "rb").read()
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"""


def page(histograms: int, buckets: int, engines: int) -> str:
    """A vLLM-like /metrics page: gauges and counters of the vocabulary and many histograms."""
    out = []
    for e in range(engines):
        lab = f'engine="{e}",model_name="meta-llama/Llama-3.1-8B-Instruct"'
        out += [f"vllm:num_requests_running{{{lab}}} 12.0",
                f"vllm:num_requests_waiting{{{lab}}} 3.0",
                f"vllm:kv_cache_usage_perc{{{lab}}} 0.42",
                f"vllm:prefix_cache_queries_total{{{lab}}} 123456.0",
                f"vllm:prefix_cache_hits_total{{{lab}}} 23456.0",
                f"vllm:prompt_tokens_total{{{lab}}} 9.87e+06",
                f"vllm:generation_tokens_total{{{lab}}} 1.23e+07"]
        for h in range(histograms):
            name = f"vllm:histogram_{h}_seconds"
            out += [f"# HELP {name} A histogram.", f"# TYPE {name} histogram"]
            for b in range(buckets):
                out.append(f'{name}_bucket{{{lab},le="{0.001 * 2 ** (b / 2):.6g}"}} {b * 17}.0')
            out += [f'{name}_bucket{{{lab},le="+Inf"}} 999.0', f"{name}_sum{{{lab}}} 12.5",
                    f"{name}_count{{{lab}}} 999.0"]
    return "\n".join(out) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--histograms", type=int, default=25)
    p.add_argument("--buckets", type=int, default=30)
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--fast", type=int, default=300, help="back-to-back scrapes for the per-scrape cost")
    a = p.parse_args()
    text = page(a.histograms, a.buckets, a.engines)
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "metrics.txt"
        f.write_text(text)
        srv = subprocess.Popen([sys.executable, "-c", SERVE, str(f)], stdout=subprocess.PIPE,
                               text=True)
        try:
            url = f"http://127.0.0.1:{srv.stdout.readline().strip()}/metrics"
            with Scraper(url, interval_s=0.001) as fast:
                while len(fast.series.t_s) < a.fast:
                    time.sleep(0.01)
            n = len(fast.series.t_s)
            per_ms = fast.series.cpu_s / n * 1e3
            with Scraper(url, interval_s=a.interval) as sc:
                time.sleep(a.seconds)
            s = sc.series
        finally:
            srv.terminate()
            srv.wait()
    lines = len(text.splitlines())
    print(f"page: {len(text) / 1024:.0f} KiB, {lines} lines ({a.engines} engines x "
          f"{a.histograms} histograms x {a.buckets} buckets)")
    print(f"per scrape: {per_ms:.2f} ms CPU ({n} back-to-back scrapes; "
          f"{lines / per_ms / 1e3:.2f} M lines/s)")
    print(f"at {a.interval:g} s for {s.wall_s:.1f} s: {len(s.t_s)} scrapes, {s.cpu_s * 1e3:.1f} ms "
          f"CPU = {100 * s.cpu_share:.3f}% of one core (budget 1%); "
          f"failed {sum(e is not None for e in s.errors)}")


if __name__ == "__main__":
    main()
