"""Capacity checks made before the engine allocates: a KV cache that cannot fit is refused
with a one-line error (`--max-running-requests 100000` used to start allocating ~180 GiB)."""

from __future__ import annotations

import torch

from servelab.errors import UserError


def free_bytes(device: str) -> int | None:
    """Memory a new allocation can take on `device` (None when unknown)."""
    if device.startswith("cuda"):
        try:
            return int(torch.cuda.mem_get_info(torch.device(device))[0])
        except (RuntimeError, AssertionError):
            return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_kv_fits(cfg, args, ctx: int, dtype: torch.dtype) -> None:
    """Refuse a KV cache that cannot fit before allocating it (`--max-running-requests 100000`
    used to start allocating tens of GB and die, or swap the machine); the prefix cache's pool
    counts too (its rows have the same width, in at most as many layers)."""
    pool = args.radix_cache_blocks * args.page_size
    rows = (args.max_running_requests + 1) * ctx + pool
    need = rows * (cfg.kv_dim + cfg.index_dim) * (cfg.n_layers + 1) * dtype.itemsize
    free = free_bytes(args.device)
    if free is not None and need > 0.8 * free:
        of_it = (f" ({pool / rows * need / 2**30:.1f} GiB of it the prefix cache: "
                 "--disable-radix-cache frees it)" if pool else "")
        raise UserError(
            f"--max-running-requests {args.max_running_requests} x --context-length "
            f"{args.context_length} needs {need / 2**30:.1f} GiB of KV cache{of_it}; "
            f"{free / 2**30:.1f} GiB is free on {args.device}: lower one of them")
