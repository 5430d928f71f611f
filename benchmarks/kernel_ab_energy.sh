#!/usr/bin/env bash
# examples/kernel_ab.toml on one GPU with its energy and telemetry. On a GPU machine whose Python
# has torch but not all of servelab's dependencies, put their wheels in .whl/ first (e.g.
# `pip download --no-deps --only-binary=:all: --python-version 3.12 --platform
# manylinux2014_x86_64 -d .whl pydantic pydantic_core annotated-types typing-inspection fastapi
# starlette uvicorn orjson ijson opentelemetry-api typing_extensions annotated-doc`); they are
# installed into /tmp/site. Writes report.html/.md,
# the --json document, the run's log and results.db to $OUT (or ./out), and prints J/token per
# arm and load point last.
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD/src
fi
export PYTHONUNBUFFERED=1 SERVELAB_HOME=${SERVELAB_HOME:-/tmp/servelab-home}
python3 -c "import servelab.mini.server.app, servelab.experiment.run.runner" || exit 1
nvidia-smi --query-gpu=name,driver_version,power.draw,power.limit,clocks.sm --format=csv
python3 -c "import pynvml as n; n.nvmlInit(); h=n.nvmlDeviceGetHandleByIndex(0); print('NVML', n.nvmlDeviceGetName(h), n.nvmlDeviceGetTotalEnergyConsumption(h), 'mJ')"
timeout "${RUN_TIMEOUT_S:-480}" python3 -m servelab run examples/kernel_ab.toml > "$OUT/run.log" 2>&1
echo "run exit $?"; tail -25 "$OUT/run.log"
python3 -m servelab report kernel-ab-sparse-mla --json > "$OUT/report.json" 2> "$OUT/report.err"
d=$SERVELAB_HOME/reports/kernel-ab-sparse-mla
cp "$d/report.html" "$d/report.md" "$SERVELAB_HOME/results.db" "$OUT/" 2>/dev/null
python3 - "$OUT/report.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
sp = {(s["arm"], s["load_key"], s["metric"]): s for s in doc["spreads"]}
ef = {(e["arm"], e["load_key"], e["metric"]): e for e in doc["effects"]}
g = lambda x: "n/a" if x is None else f"{x:.4g}"
pct = lambda x: "n/a" if x is None else f"{(x - 1) * 100:+.1f}%"
print("arm      load   J/tok median [CI]          tok/J    J/tok vs baseline [CI], verdict   throttled")
for (arm, lk, m), s in sorted(sp.items()):
    if m != "j_per_output_token":
        continue
    t = sp.get((arm, lk, "output_tokens_per_j"), {})
    e = ef.get((arm, lk, m))
    eff = (f"{pct(e['ratio'])} [{pct(e['ci_low'])}, {pct(e['ci_high'])}] {e['verdict']}"
           if e else "(baseline)")
    print(f"{arm:8} {lk:6} {g(s['median'])} [{g(s['ci_low'])}, {g(s['ci_high'])}]".ljust(42),
          g(t.get("median")).ljust(8), eff.ljust(34), (e or {}).get("gpu_throttled") or "-")
PY
