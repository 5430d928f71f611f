"""Generate servelab's flag table for one engine version from the engine's own parser.

Run it with an interpreter where the engine (any version you want a table for) imports, e.g.
a throwaway venv, or the unpacked wheel plus the few packages its parser module imports:

  pip download --no-deps --only-binary=:all: sglang==0.5.23 -d /tmp/whl
  unzip -qo /tmp/whl/sglang-0.5.23-*.whl -d /tmp/eng
  pip install --no-deps --target /tmp/eng-deps msgspec psutil pybase64 pyzmq ipython traitlets
  PYTHONPATH=/tmp/eng:/tmp/eng-deps python scripts/gen_engine_flags.py sglang server

With `lookup ENGINE` it records instead where the engine's own block-FP8 config lookup
(`get_w8a8_block_fp8_configs`) looks: the folder, the file-name pattern and how it spells
sample device names (src/servelab/tune/engine_lookup.py `record`), into
src/servelab/kernels/fp8_gemm/lookups/<engine>-<version>.json; for vLLM also the keys its
kernel takes. Tests check every file `servelab tune` writes against it where the engine is
absent (docs/TUNING.md, "Checking against the engines").

  PYTHONPATH=/tmp/eng python scripts/gen_engine_flags.py lookup vllm

The flag tables: it runs src/servelab/engines/parser_probe.py (the same probe servelab uses to ask an engine's
parser at pre-flight) with `dump`, and writes src/servelab/engines/flags/<engine>-<role>-
<version>.json: every option string, whether it takes a value, nargs, choices, and whether the
parser marks it deprecated. The table records the engine version and the parser it came from;
servelab reads it only when the engine cannot be imported in the experiment's interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = ROOT / "src" / "servelab" / "engines" / "parser_probe.py"
OUT = ROOT / "src" / "servelab" / "engines" / "flags"
LOOKUP = ROOT / "src" / "servelab" / "tune" / "engine_lookup.py"
LOOKUPS = ROOT / "src" / "servelab" / "kernels" / "fp8_gemm" / "lookups"


def render(table: dict) -> str:
    """JSON with one option per line: a new engine version reads as a diff of its flags."""
    opts = table["options"]
    head = [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in table.items() if k != "options"]
    body = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in opts.items()]
    return "\n".join(["{", *head, ' "options": {', ",\n".join(body), " }", "}"]) + "\n"


def lookup_table(engine: str) -> int:
    """Record the engine's config lookup (see the module docstring)."""
    got = subprocess.run([sys.executable, str(LOOKUP), f"record:{engine}"],
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, "SERVELAB_SRC": str(ROOT / "src")})
    if got.returncode != 0:
        print(got.stdout + got.stderr, file=sys.stderr)
        return 1
    table = json.loads(got.stdout.strip().splitlines()[-1])
    table["generated_by"] = "scripts/gen_engine_flags.py lookup"
    table["generated_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    LOOKUPS.mkdir(parents=True, exist_ok=True)
    path = LOOKUPS / f"{engine}-{table['version']}.json"
    path.write_text(json.dumps(table, indent=1) + "\n")
    print(f"{path.relative_to(ROOT)}: {engine} {table['version']} reads {table['folder']}/"
          f"{table['file_name']}")
    return 0


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    if argv[0] == "lookup":
        return lookup_table(argv[1])
    engine, role = argv
    got = subprocess.run([sys.executable, str(PROBE), "dump", engine, role],
                         capture_output=True, text=True, timeout=600)
    if got.returncode != 0:
        print(got.stdout + got.stderr, file=sys.stderr)
        return 1
    table = json.loads(got.stdout)
    table["generated_by"] = "scripts/gen_engine_flags.py"
    table["generated_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{engine}-{role}-{table['version']}.json"
    path.write_text(render(table))
    print(f"{path.relative_to(ROOT)}: {len(table['options'])} options of {engine} "
          f"{table['version']} ({table['parser']})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
