"""Compile-ahead bookkeeping (servelab.tune.compile.Precompiler) with a thread pool and a fake
compiler standing in for Triton: what is compiled, by whom, what is skipped, and when."""

from __future__ import annotations

import concurrent.futures as cf
import threading
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from servelab.tune.compile import Precompiler
from servelab.tune.space import enumerate_space


class FakeCompiler:
    """Records each compile; fails configs with BLOCK_SIZE_N == 64; holds until released."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.lock = threading.Lock()
        self.gate = threading.Event()

    def __call__(self, cfg: dict[str, int]) -> str | None:
        self.gate.wait(10)
        with self.lock:
            self.calls.append(f"m{cfg['BLOCK_SIZE_M']}n{cfg['BLOCK_SIZE_N']}")
        return "OutOfResources: shared memory" if cfg["BLOCK_SIZE_N"] == 64 else None


def _pc(marks: Path, fake: FakeCompiler) -> Precompiler:
    return Precompiler("cuda", None, 2, marker_dir=marks,
                       executor=lambda: cf.ThreadPoolExecutor(2), compile_fn=fake)


def test_submit_returns_before_compiles_and_wait_blocks_per_config(tmp_path: Path) -> None:
    fake = FakeCompiler()
    pc = _pc(tmp_path, fake)
    cfgs = [c for c in enumerate_space("tiny") if c.group_m == 1 and c.block_k == 64]
    assert {c.block_n for c in cfgs} == {32, 64}
    pc.submit(cfgs)                      # the gate is shut: nothing can have compiled yet
    assert fake.calls == [] and not any((tmp_path / c.key).exists() for c in cfgs)
    fake.gate.set()
    errs = [pc.wait(c) for c in cfgs]
    assert len(fake.calls) == 4 and pc.compiled == 4
    assert [e is not None for e in errs] == [c.block_n == 64 for c in cfgs]
    assert all((tmp_path / c.key).exists() for c in cfgs)
    pc.close()


def test_second_worker_skips_what_the_first_compiled_and_needs_no_pool(tmp_path: Path) -> None:
    fake1, fake2 = FakeCompiler(), FakeCompiler()
    fake1.gate.set()
    fake2.gate.set()
    cfgs = enumerate_space("tiny")
    first = _pc(tmp_path, fake1)
    errs1 = first.ensure(cfgs[:6])
    first.close()
    second = _pc(tmp_path, fake2)
    errs2 = second.ensure(cfgs)          # 6 noted by the first, the rest new
    assert len(fake2.calls) == len(cfgs) - 6 and second.skipped == 6
    assert set(errs1) <= set(errs2)      # a noted failure stays a failure for the other worker
    assert {c for c in cfgs if c.block_n == 64} == set(errs2)
    second.close()
    third = _pc(tmp_path, FakeCompiler())
    assert third.ensure(cfgs) == errs2 and third._pool is None and third.compiled == 0


def test_off_on_cpu_marks_done_without_compiling(tmp_path: Path) -> None:
    fake = FakeCompiler()
    pc = Precompiler("cpu", None, 4, marker_dir=tmp_path, compile_fn=fake)
    assert pc.ensure(enumerate_space("tiny")) == {} and fake.calls == []
    assert list(tmp_path.iterdir()) == []


def test_a_broken_pool_notes_nothing_and_turns_compile_ahead_off(tmp_path: Path) -> None:
    def broken(cfg: dict[str, int]) -> str | None:
        raise BrokenProcessPool("a compile process died")

    pc = Precompiler("cuda", None, 2, marker_dir=tmp_path,
                     executor=lambda: cf.ThreadPoolExecutor(1), compile_fn=broken)
    cfgs = enumerate_space("tiny")[:3]
    assert pc.ensure(cfgs) == {}                 # the launches will compile (and report)
    assert pc.status.startswith("off: BrokenProcessPool") and not pc.enabled
    assert list(tmp_path.iterdir()) == [] and pc.compiled == 0
    pc.close()


def test_engine_launcher_units_compile_in_a_real_process_pool():
    """engine_tune.UnitCompiler (used by `tune fp8-gemm --kernel sglang|vllm`): each unit's
    candidates go to a spawn-context pool that launches the kernel on inputs specialised like
    the unit's; a failing compile is reported for that config and unit only, and a variant
    already compiled for an earlier unit of the same specialisation is not sent again. Here
    the launch needs CUDA, which this machine lacks: every compile fails, and says why."""
    import torch

    from servelab.tune.engine_tune import UnitCompiler
    from servelab.tune.space import Config
    if torch.cuda.is_available():
        import pytest
        pytest.skip("CPU-only check of the failure path")
    uc = UnitCompiler("servelab", workers=1)
    a, b = Config(16, 64, 128, 1, 4, 3), Config(32, 64, 128, 1, 4, 3)
    try:
        uc.at(256, 512, 16)
        uc.submit([a, b])
        assert uc.compiled == 2 and uc.skipped == 0 and uc.status.startswith("on: 1")
        err = uc.wait(a)
        assert err is not None and ("CUDA" in err or "cuda" in err), err
        assert uc.wait(b) is not None and uc.seconds > 0
        uc.at(256, 512, 32)              # M = 32: same class as 16 (multiple of 16), same K
        uc.submit([a])
        assert uc.compiled == 2 and uc.skipped == 1
        uc.at(256, 512, 1)               # M = 1 specialises differently: compiled again
        uc.submit([a])
        assert uc.compiled == 3
    finally:
        uc.close()
