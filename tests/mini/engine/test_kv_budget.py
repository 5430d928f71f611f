"""The KV budget (engine/kv_budget.py): a KV cache that cannot fit in 80 % of the free memory is
refused with one line naming the flags, before anything is allocated; unknown free memory
refuses nothing."""

from __future__ import annotations

import pytest
import torch

from servelab.errors import UserError
from servelab.mini.engine import kv_budget
from servelab.mini.engine.args import EngineArgs
from servelab.mini.model.config import get_config


def test_a_kv_cache_beyond_the_free_memory_is_refused(monkeypatch):
    cfg = get_config("micro")
    args = EngineArgs(config="micro", max_running_requests=7, context_length=100,
                      disable_radix_cache=True)
    ctx = 110
    need = 8 * ctx * (cfg.kv_dim + cfg.index_dim) * (cfg.n_layers + 1) * 4  # 8 slots: + scratch
    monkeypatch.setattr(kv_budget, "free_bytes", lambda device: int(need / 0.8) + 1)
    kv_budget.check_kv_fits(cfg, args, ctx, torch.float32)  # just fits
    monkeypatch.setattr(kv_budget, "free_bytes", lambda device: int(need / 0.8) - 64)
    with pytest.raises(UserError, match="--max-running-requests 7 x --context-length 100") as ei:
        kv_budget.check_kv_fits(cfg, args, ctx, torch.float32)
    assert "\n" not in str(ei.value)
    monkeypatch.setattr(kv_budget, "free_bytes", lambda device: None)
    kv_budget.check_kv_fits(cfg, args, ctx, torch.float32)


def test_free_bytes_reads_the_machine():
    free = kv_budget.free_bytes("cpu")
    assert free is None or free > 0


def test_the_prefix_cache_pool_counts_and_is_named(monkeypatch):
    cfg = get_config("micro")
    args = EngineArgs(config="micro", max_running_requests=7, context_length=100, page_size=16)
    ctx = 110
    pool = 44 * 16  # 7 x 100 tokens by default, rounded up to whole blocks of 16
    need = (8 * ctx + pool) * (cfg.kv_dim + cfg.index_dim) * (cfg.n_layers + 1) * 4
    monkeypatch.setattr(kv_budget, "free_bytes", lambda device: int(need / 0.8) + 1)
    kv_budget.check_kv_fits(cfg, args, ctx, torch.float32)
    monkeypatch.setattr(kv_budget, "free_bytes", lambda device: int(need / 0.8) - 64)
    with pytest.raises(UserError, match="of it the prefix cache: --disable-radix-cache frees it"):
        kv_budget.check_kv_fits(cfg, args, ctx, torch.float32)
