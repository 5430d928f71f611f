"""Compile configs ahead of timing, in parallel on the CPU cores.

Triton compiles on first launch, one config at a time, single-threaded. A pool of processes
calls the kernel's `warmup` (compile only) for each config on tiny inputs that specialize
exactly as the real ones (M and the scale strides are not specialized; N, K and the other
strides are multiples of 16 for every shape tuned), so the binaries land in Triton's on-disk
cache and the timing process only loads them. A config that fails to compile is reported and
skipped; nothing here is fatal.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import os
import time

from servelab.tune.space import Config

_STATE: dict = {}


def _init_child(gpu: str | None) -> None:
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    import torch

    from servelab.kernels.fp8_gemm import reference as R
    dev = "cuda"
    a_q = torch.zeros((16, 256), device=dev).to(R.FP8_DTYPE)
    b_q = torch.zeros((256, 256), device=dev).to(R.FP8_DTYPE)
    a_s = torch.ones((16, 2), device=dev)
    b_s = torch.ones((2, 2), device=dev)
    c = torch.empty((16, 256), device=dev, dtype=torch.bfloat16)
    _STATE["args"] = (a_q, a_s, b_q, b_s, c)


def _compile_one(cfg: dict[str, int]) -> str | None:
    from servelab.kernels.fp8_gemm import kernel as K
    a_q, a_s, b_q, b_s, c = _STATE["args"]
    m, k = a_q.shape
    n = b_q.shape[0]
    try:
        K._w8a8_block_fp8_matmul.warmup(
            a_q, b_q, c, a_s, b_s, m, n, k,
            a_q.stride(0), a_q.stride(1), b_q.stride(0), b_q.stride(1), c.stride(0), c.stride(1),
            a_s.stride(0), a_s.stride(1), b_s.stride(0), b_s.stride(1),
            GROUP_N=128, GROUP_K=128, BLOCK_SIZE_M=cfg["BLOCK_SIZE_M"],
            BLOCK_SIZE_N=cfg["BLOCK_SIZE_N"], BLOCK_SIZE_K=cfg["BLOCK_SIZE_K"],
            GROUP_SIZE_M=cfg["GROUP_SIZE_M"], num_warps=cfg["num_warps"],
            num_stages=cfg["num_stages"], grid=(1,),
        )
    except Exception as exc:  # noqa: BLE001 - reported, the config is skipped
        return f"{type(exc).__name__}: {str(exc).strip()[:200]}"
    return None


class Precompiler:
    """A pool of compile processes for one GPU; `ensure(configs)` compiles those not yet done."""

    def __init__(self, device: str, gpu: str | None, workers: int) -> None:
        self.device = device
        self.done: dict[Config, str | None] = {}
        self.seconds = 0.0
        self._pool: cf.ProcessPoolExecutor | None = None
        self.status = f"on: {workers} processes" if device == "cuda" and workers > 0 else "off"
        if device == "cuda" and workers > 0:
            self._pool = cf.ProcessPoolExecutor(
                max_workers=workers, mp_context=mp.get_context("spawn"),
                initializer=_init_child, initargs=(gpu,),
            )

    def ensure(self, configs: list[Config]) -> dict[Config, str]:
        """Compile the configs not compiled yet; returns {config: error} for those that failed."""
        todo = [c for c in dict.fromkeys(configs) if c not in self.done]
        if todo and self._pool is not None:
            t0 = time.perf_counter()
            try:
                for c, err in zip(todo, self._pool.map(_compile_one, [c.as_engine() for c in todo]),
                                  strict=True):
                    self.done[c] = err
            except Exception as exc:         # noqa: BLE001 - compile on first launch from now on
                self.status = f"off: {type(exc).__name__}: {exc}"[:200]
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None
            self.seconds += time.perf_counter() - t0
        else:
            for c in todo:
                self.done[c] = None
        return {c: e for c in configs if (e := self.done.get(c))}

    def close(self) -> None:
        """Stop the pool without waiting on it (a graceful shutdown was seen to hang on the
        H200 machine, 2026-11-29); its processes are ours, ended by pid."""
        if self._pool is not None:
            procs = list(getattr(self._pool, "_processes", {}).values())
            self._pool.shutdown(wait=False, cancel_futures=True)
            for p in procs:
                if p.is_alive():
                    p.terminate()
            for p in procs:
                p.join(timeout=5)
            self._pool = None
