#!/usr/bin/env bash
# vLLM's own block-FP8 GEMM through servelab's tuner on the GPU at hand, in one call
# (numbers: docs/performance.md "FP8 GEMM", docs/notes/2026-12-02-vllm-fp8-tuning.md):
#   1. benchmarks/bench_fp8_gemm_engine.py --engine vllm: vLLM's launcher against the fp64
#      reference, tuning on it (tune/engine_tune.py, vLLM's shipped config a finalist of every
#      point), then vLLM's own lookup before and after `tune install` (restored at the end),
#      the two configs timed in six alternating passes;
#   2. the CLI on vLLM's kernel: `tune fp8-gemm --kernel vllm --format vllm` (compile pool
#      on), `tune verify` (tuned vs vLLM's shipped file vs its default), `tune install
#      --engine vllm` (confirmed by vLLM's own lookup under this GPU's own name), `--restore`;
#   3. the CLI on SGLang's kernel, whose units now compile their candidates in a pool.
# vLLM and SGLang need only be on PYTHONPATH (where `vllm` does not import, e.g. its compiled
# ops built for another torch, its kernel, launcher and lookup run from its own file:
# kernels/fp8_gemm/vllm_source.py; the label printed says which).
#
#   PYTHONPATH=src:/path/to/site benchmarks/bench_fp8_gemm_vllm.sh OUT [TUNE_S]
set -u
OUT=${1:?usage: bench_fp8_gemm_vllm.sh OUT [TUNE_S]}
TUNE_S=${2:-60}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
quiet() { grep -v -e "Using default W8A8" -e "Using configuration from"; }

echo "== 1. vLLM's kernel: check, tune, compare through vLLM's own lookup"
timeout 165 "$PY" benchmarks/bench_fp8_gemm_engine.py "$OUT/engine" --engine vllm \
    --tune-s "$TUNE_S" --shapes 4096,512 1024,4096 18432,7168 \
    --batch-sizes 1,16,64,256,1024,4096 2>&1 | quiet
echo "rc=$?"

echo "== 2. the CLI on vLLM's kernel"
timeout 60 "$PY" -m servelab tune fp8-gemm --kernel vllm --format vllm --shape 4096,512 \
    --batch-sizes 1,64 --search fast --budget 0.05 --out "$OUT/cli-vllm" 2>&1 | quiet
timeout 35 "$PY" -m servelab tune verify "$OUT/cli-vllm" --engine vllm --kernel vllm 2>&1 | quiet
timeout 35 "$PY" -m servelab tune install "$OUT/cli-vllm" --engine vllm 2>&1 | quiet
timeout 25 "$PY" -m servelab tune install --engine vllm --restore 2>&1 | quiet

echo "== 3. the CLI on SGLang's kernel, candidates compiled in a pool"
timeout 60 "$PY" -m servelab tune fp8-gemm --kernel sglang --format sglang --shape 4096,512 \
    --batch-sizes 1,64 --search fast --budget 0.05 --out "$OUT/cli-sglang" 2>&1 | quiet

echo "== compile ahead per unit (from the checkpoints)"
"$PY" - "$OUT" <<'EOF'
import json, pathlib, sys
for ck in sorted(pathlib.Path(sys.argv[1]).glob("cli-*/*.jsonl")):
    for line in ck.read_text().splitlines():
        r = json.loads(line)
        if r.get("t") == "unit":
            print(f"{ck.parent.name} M={r['m']}: {r['compile_ahead']}, compiled {r['compiled']},"
                  f" waited {r['compile_s']} s, unit {r['seconds']:.1f} s, timed "
                  f"{r['timed']}/{r['candidates']}, failed {r['failed']}, {r['kernel']}")
EOF
