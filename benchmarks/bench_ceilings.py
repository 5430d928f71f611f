"""The GPU's measured ceilings, the one source the roofline floors use
(profile/presets/gpus/<gpu>.toml `[measured]`; sparse_mla_common.ceilings reads them).

- copy: device-to-device copy of 1 GiB, bytes read + written per second
  (tune.timing.copy_rate_tbs: CUDA events, no graph, median of 6 after 2 warm-ups);
- bf16 / fp8 matmul: 8192^3 products on random data (torch.matmul; torch._scaled_mm with
  per-tensor scales), after tune.timing.warm_up_gpu, timed with tune.timing.cuda_time_us
  (graph replays of 4 products, median over replays), 2 x 8192^3 FLOPs a product.

Prints one JSON line per quantity and writes OUT/ceilings.json (value, spread, device, date,
command), from which the preset's `[measured]` rows are copied.

    PYTHONPATH=src python3 benchmarks/bench_ceilings.py --out $OUT/ceilings
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from servelab.tune.timing import copy_rate_tbs, cuda_time_us, warm_up_gpu


def _matmul_tflops(dtype: str, n: int = 8192, reps: int = 20) -> tuple[float, float]:
    """(median, half-IQR) TFLOP/s of n^3 products in bf16 or fp8 (per-tensor scales)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(n, n, device="cuda", generator=gen)
    b = torch.randn(n, n, device="cuda", generator=gen)
    if dtype == "bf16":
        a, b = a.to(torch.bfloat16), b.to(torch.bfloat16)

        def launch() -> None:
            torch.matmul(a, b)
    else:
        a8 = a.to(torch.float8_e4m3fn)
        b8 = b.to(torch.float8_e4m3fn).t().contiguous().t()  # column-major B for cuBLASLt
        one = torch.ones((), device="cuda")

        def launch() -> None:
            torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    us = cuda_time_us(launch, reps, min_calls=4, max_calls=4)
    tf = [2 * n**3 / u / 1e6 for u in us]
    q = statistics.quantiles(tf, n=4)
    return statistics.median(tf), (q[2] - q[0]) / 2


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("out/ceilings"))
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("the ceilings are a GPU's: run this on the machine whose preset it fills")
    args.out.mkdir(parents=True, exist_ok=True)
    props = torch.cuda.get_device_properties(0)
    meta = {"device": props.name, "sms": props.multi_processor_count,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "torch": torch.__version__,
            "command": "PYTHONPATH=src python3 benchmarks/bench_ceilings.py"}  # fmt: skip
    warm_up_gpu(2.0)
    copies = [copy_rate_tbs() for _ in range(3)]
    rows = {"copy_tb_s": {"value": statistics.median(copies), "runs": copies}}
    for dtype in ("bf16", "fp8"):
        v, spread = _matmul_tflops(dtype)
        rows[f"{dtype}_matmul_tflop_s"] = {"value": v, "half_iqr": spread}
    out = {**meta, **rows}
    for k, v in rows.items():
        print(json.dumps({k: v}), flush=True)
    (args.out / "ceilings.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
