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
import hashlib
import multiprocessing as mp
import os
import time
from collections.abc import Callable
from pathlib import Path

from servelab.atomic import write_text
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


def _marker_dir() -> Path | None:
    """Where this kernel's compiled configs are noted, inside Triton's on-disk cache so a note
    never outlives the binary it stands for; keyed by the kernel source, Triton and the GPU."""
    try:
        import torch
        import triton

        from servelab.kernels.fp8_gemm import kernel as K
        src = Path(K.__file__).read_bytes()
        cap = ".".join(map(str, torch.cuda.get_device_capability()))
        key = hashlib.sha256(src + f"|{triton.__version__}|{cap}".encode()).hexdigest()[:24]
    except Exception:  # noqa: BLE001 - no notes: every worker compiles what it needs
        return None
    root = os.environ.get("TRITON_CACHE_DIR") or str(Path.home() / ".triton" / "cache")
    return Path(root) / "servelab-compiled" / key


class Precompiler:
    """A pool of compile processes for one GPU worker.

    `submit(configs)` queues those not compiled yet and returns at once; `wait(config)` blocks
    until that one is compiled, so timing starts with the first config while the rest compile
    (the pool works in submission order). Each compiled config is noted in a marker file beside
    Triton's cache, so the other GPUs' workers and later jobs on the machine skip it (their
    launch loads the binary from the cache); the pool itself starts only when something needs
    compiling, so a job whose configs are all cached spawns no compile processes.
    """

    def __init__(self, device: str, gpu: str | None, workers: int, *,
                 marker_dir: Path | None | str = "auto",
                 executor: Callable[[], cf.Executor] | None = None,
                 compile_fn: Callable[[dict[str, int]], str | None] | None = None) -> None:
        """`marker_dir`, `executor` and `compile_fn` default to the real thing (a note dir in
        Triton's cache, a spawn-context process pool, `_compile_one`); tests swap them."""
        self.device, self.gpu, self.workers = device, gpu, workers
        self._executor = executor
        self._compile_fn = compile_fn or _compile_one
        self.done: dict[Config, str | None] = {}
        self.seconds = 0.0           # time spent blocked in wait()
        self.compiled = 0            # configs this worker's pool compiled
        self.skipped = 0             # configs another worker or job had compiled already
        self._pending: dict[Config, cf.Future] = {}
        self._pool: cf.ProcessPoolExecutor | None = None
        self.enabled = device == "cuda" and workers > 0
        self.status = f"on: {workers} processes" if self.enabled else "off"
        if not self.enabled:
            self._markers = None
        else:
            self._markers = _marker_dir() if marker_dir == "auto" else marker_dir

    def _marker(self, c: Config) -> Path | None:
        return self._markers / c.key if self._markers is not None else None

    def _known(self, c: Config) -> bool:
        """Compiled (or failed) already, by this worker or noted by another."""
        if c in self.done:
            return True
        mk = self._marker(c)
        if mk is not None and mk.exists():
            err = mk.read_text()
            self.done[c] = err or None
            self.skipped += 1
            return True
        return False

    def submit(self, configs: list[Config]) -> None:
        """Queue the configs not compiled yet; returns at once."""
        todo = [c for c in dict.fromkeys(configs) if c not in self._pending and not self._known(c)]
        if not todo:
            return
        if not self.enabled:
            for c in todo:
                self.done[c] = None
            return
        try:
            if self._pool is None:
                self._pool = self._executor() if self._executor else cf.ProcessPoolExecutor(
                    max_workers=self.workers, mp_context=mp.get_context("spawn"),
                    initializer=_init_child, initargs=(self.gpu,),
                )
            for c in todo:
                self._pending[c] = self._pool.submit(self._compile_fn, c.as_engine())
        except Exception as exc:  # noqa: BLE001 - compile on first launch from now on
            self._disable(exc)

    def _disable(self, exc: BaseException) -> None:
        self.status = f"off: {type(exc).__name__}: {exc}"[:200]
        self.enabled = False
        for c in self._pending:
            self.done.setdefault(c, None)
        self._pending.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def wait(self, c: Config) -> str | None:
        """Block until `c` is compiled; its compile error, if any (then the launch reports it)."""
        fut = self._pending.pop(c, None)
        if fut is not None:
            t0 = time.perf_counter()
            try:
                err, ran = fut.result(), True
            except Exception as exc:  # noqa: BLE001 - a broken pool: compile on first launch
                self._disable(exc)
                err, ran = None, False
            self.seconds += time.perf_counter() - t0
            self.done[c] = err
            self.compiled += ran
            mk = self._marker(c)
            if mk is not None and ran:           # never note a config the pool did not compile
                try:
                    mk.parent.mkdir(parents=True, exist_ok=True)
                    write_text(mk, err or "")
                except OSError:
                    pass                 # a note is an optimisation only
        return self.done.get(c)

    def ensure(self, configs: list[Config]) -> dict[Config, str]:
        """Compile the configs not compiled yet and wait for all; {config: error} of failures."""
        self.submit(configs)
        errs = {c: self.wait(c) for c in dict.fromkeys(configs)}
        return {c: e for c, e in errs.items() if e}

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
