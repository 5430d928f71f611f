#!/usr/bin/env bash
# Record GPU traces of the embedded engine through its SGLang-style POST /start_profile, the way a
# user profiles a live server: start `servelab serve`, `servelab profile capture` under load,
# analyse. Used on the H200 (device image: carry our wheels, see docs/performance.md).
#   usage: benchmarks/record_engine_trace.sh OUT_DIR [extra serve flags...]
# Writes OUT_DIR/<label>/*.trace.json.gz, OUT_DIR/<label>.json (analysis), OUT_DIR/<label>.log.
set -u
out=${1:?usage: record_engine_trace.sh OUT_DIR}; shift
port=30123
mkdir -p "$out"
record() {  # label steps load serve-flags...
  local label=$1 steps=$2 load=$3; shift 3
  python3 -m servelab serve --config flash --device cuda --port $port "$@" >"$out/$label.log" 2>&1 &
  local pid=$!
  for _ in $(seq 180); do
    python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/health', timeout=2)" \
      >/dev/null 2>&1 && break
    kill -0 $pid 2>/dev/null || break
    sleep 1
  done
  python3 -m servelab profile capture --url "http://127.0.0.1:$port" --num-steps "$steps" \
    --load "$load" --max-tokens 96 --out "$out/$label" --output-file "$out/$label.json" --timeout 90 \
    >>"$out/$label.log" 2>&1 || echo "capture $label failed (see $label.log)"
  kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null
  tail -n 25 "$out/$label.log"
}
record graph 30 8 --cuda-graph
record eager 8 4
