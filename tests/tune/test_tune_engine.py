"""Tuning for the engine that will read the files: every key the engines' files use, the
engine's own launcher and lookup, installing into its folder and restoring, and the rule that
a tuned config replaces the shipped one only when clearly faster.

The tests that need SGLang's or vLLM's source run where the engine is importable or its
wheel is unpacked on the path; servelab's own venv has neither (engines live in their own).
To check against the real engines:
  pip download --no-deps --only-binary=:all: sglang==0.5.23 vllm==0.33.0 -d /tmp/whl
  mkdir -p /tmp/eng && for w in /tmp/whl/*.whl; do unzip -qo "$w" -d /tmp/eng; done
  PYTHONPATH=src:/tmp/eng python -m pytest tests/tune/test_tune_engine.py tests/engines
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from interpreter import interpreter_or_skip

from servelab.errors import UserError
from servelab.kernels.fp8_gemm import engine as EK
from servelab.kernels.fp8_gemm import formats as F
from servelab.tune import engine_space, engine_tune, install
from servelab.tune import verify as V
from servelab.tune.space import Config

interpreter_or_skip("tests/tune/test_tune_engine.py")

H200 = "NVIDIA H200"
BASE = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
        "num_warps": 4}
# entries as the engines ship them (SGLang's sm90 keys, vLLM's ROCm entries without
# num_stages); servelab's reader rejected all of these before
SHIPPED_STYLE = {
    "1": {**BASE, "num_stages": 4, "SPLIT_K": 4, "SWAP_AB": True},
    "8": {**BASE, "num_stages": 2, "waves_per_eu": 0},
    "64": {**BASE, "kpack": 1, "matrix_instr_nonkdim": 16},
}


def _need(engine: str) -> Path:
    folder = EK.config_dir(engine)
    if folder is None or not folder.is_dir():
        pytest.skip(f"{engine} is not importable here: see this module's docstring")
    return folder


def test_every_key_the_engines_ship_is_read_and_written_back(tmp_path):
    p = tmp_path / F.config_file_name("sglang", 7168, 18432, H200)
    p.write_text(json.dumps(SHIPPED_STYLE))
    entries = F.read_config_file(p)
    assert entries[1]["SPLIT_K"] == 4 and entries[1]["SWAP_AB"] is True
    assert "num_stages" not in entries[64] and entries[64]["kpack"] == 1
    assert F.read_config_file(p) == {int(k): v for k, v in SHIPPED_STYLE.items()}
    for m, e in entries.items():                 # through the tuner's Config and back
        assert Config.from_engine(e).as_engine() == e, m
    assert Config.from_engine(entries[64]).stages == 3    # Triton's default where none
    out = tmp_path / "merged.json"
    F.merge_write_config(out, entries)
    assert json.loads(out.read_text()) == SHIPPED_STYLE
    with pytest.raises(ValueError, match="unknown keys \\['BLOCK_M'\\].*known: BLOCK_SIZE_M"):
        F.validate_entry({**BASE, "BLOCK_M": 16}, "x")
    with pytest.raises(ValueError, match="SWAP_AB=1 is not true/false"):
        F.validate_entry({**BASE, "SWAP_AB": 1}, "x")


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_every_shipped_block_fp8_file_is_read(engine):
    folder = _need(engine)
    files = [p for p in folder.iterdir() if (n := F.parse_file_name(p.name)) and n.fmt == engine]
    assert len(files) > 100                        # 137 (SGLang 0.5.23), 244 (vLLM 0.33.0)
    bad = []
    for p in files:
        try:
            F.read_config_file(p)
        except ValueError as exc:
            bad.append(str(exc))
    assert not bad, f"{len(bad)} of {len(files)} unreadable, first: {bad[:1]}"


def _engine_copy(tmp_path: Path, device: str) -> tuple[object, Path]:
    """SGLang's kernel file run from a folder of our own, so its own lookup reads `configs/`
    there (the lookup is relative to the file) and nothing installed is touched."""
    src = _need("sglang").parent / "fp8_kernel.py"
    pkg = tmp_path / "gemm"
    (pkg / "configs").mkdir(parents=True)
    shutil.copy(src, pkg / "fp8_kernel.py")
    mod = EK._exec_file(pkg / "fp8_kernel.py", "sgl_copy_fp8",
                        EK._stub_sglang_helpers(lambda: device))
    return mod, pkg / "configs"


def test_sglang_lookup_finds_installed_files_and_restore_brings_back_the_shipped(tmp_path):
    mod, folder = _engine_copy(tmp_path, H200)
    shipped = {"1": {**BASE, "num_stages": 5}}
    name = F.config_file_name("sglang", 4096, 512, H200)
    (folder / name).write_text(json.dumps(shipped))        # the engine ships this shape
    tuned_dir = tmp_path / "tuned"
    tuned_dir.mkdir()
    tuned = {1: {**BASE, "num_stages": 4, "SPLIT_K": 2}, 64: {**BASE, "num_stages": 3}}
    F.merge_write_config(tuned_dir / name, tuned)
    F.merge_write_config(tuned_dir / F.config_file_name("sglang", 1024, 4096, H200), tuned)
    F.merge_write_config(tuned_dir / F.config_file_name("vllm", 1024, 4096, H200), tuned)
    done = install.install(tuned_dir, "sglang", folder)
    assert sorted((d.name, d.replaced) for d in done) == sorted(
        [(name, True), (F.config_file_name("sglang", 1024, 4096, H200), False)])
    lookup = mod.get_w8a8_block_fp8_configs                  # SGLang's own function
    assert lookup(4096, 512, 128, 128) == tuned
    assert lookup(1024, 4096, 128, 128) == tuned
    # verify compares with what shipped, found in the backup
    assert V.shipped_entries("sglang", name, folder) == {1: shipped["1"]}
    install.install(tuned_dir, "sglang", folder)             # twice: the backup stays shipped
    install.restore(folder)
    lookup.cache_clear()
    assert lookup(4096, 512, 128, 128) == {1: shipped["1"]}
    assert lookup(1024, 4096, 128, 128) is None              # the engine never had it
    assert sorted(p.name for p in folder.iterdir()) == [name]
    with pytest.raises(UserError, match="nothing to restore"):
        install.restore(folder)


def test_install_refuses_a_malformed_file_and_copies_nothing(tmp_path):
    folder, src = tmp_path / "engine", tmp_path / "tuned"
    folder.mkdir()
    src.mkdir()
    F.merge_write_config(src / F.config_file_name("sglang", 1024, 4096, H200), {1: BASE})
    (src / F.config_file_name("sglang", 2048, 4096, H200)).write_text('{"1": {"BLOCK_SIZE_M": 16}}')
    with pytest.raises(UserError, match="malformed.*nothing installed"):
        install.install(src, "sglang", folder)
    assert list(folder.iterdir()) == []


def test_engine_folder_is_looked_up_in_the_named_interpreter():
    import sys
    if EK.package_dir("sglang") is not None:
        pytest.skip("sglang is importable here")
    with pytest.raises(UserError, match="not installed in .*--python"):
        install.engine_config_dir("sglang", sys.executable)


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_engine_launcher_runs_the_config_it_is_given(engine):
    """The engine's launcher (imported, or run from its kernel file: vLLM's from fp8_utils.py
    where vllm does not import) computes what the fp64 reference does."""
    from servelab.kernels.fp8_gemm import reference as R
    _need(engine)
    ek = EK.load(engine)
    assert ek.engine == engine and ek.version and ek.how and Path(ek.source).is_file()
    assert ek.extra_keys == ({"SPLIT_K", "SWAP_AB"} if engine == "sglang" else set())
    torch.manual_seed(0)
    aq, as_ = R.quantize_per_token_group(torch.randn(5, 256))
    bq, bs = R.quantize_weight_per_block(torch.randn(256, 256) * 0.05)
    ref = R.w8a8_block_matmul(aq, as_, bq, bs)
    bound = 2.0 ** -8 * ref.abs() + 2.0 ** -7 * R.abs_matmul(aq, as_, bq, bs)
    for cfg in ({**BASE, "num_stages": 2}, {**BASE, "BLOCK_SIZE_N": 32, "num_stages": 3}):
        out = ek.launch(aq, as_, bq, bs, cfg)
        err = (out.double() - ref).abs()
        assert int((err > bound).sum()) == 0, f"{cfg}: max err {float(err.max()):.3g}"


def test_shipped_config_is_kept_unless_clearly_beaten():
    shipped, other = Config(64, 64, 128, 1, 4, 5), Config(16, 64, 128, 1, 4, 4, 4, True)
    assert engine_tune.choose({shipped: 10.0, other: 9.95}, shipped, 0.015) == shipped
    assert engine_tune.choose({shipped: 10.0, other: 9.0}, shipped, 0.015) == other
    assert engine_tune.choose({other: 9.0}, shipped, 0.015) == other       # shipped failed
    assert engine_tune.choose({}, shipped, 0.015) == shipped


def test_engine_space_splits_and_swaps_only_where_they_can_help():
    small = engine_space.stage1(1024, 4096, 1, sms=132, hopper=True)
    assert any(c.split_k > 1 for c in small) and any(c.swap_ab for c in small)
    assert all(c.block_m <= 32 for c in small if c.swap_ab)
    big = engine_space.stage1(18432, 7168, 4096, sms=132, hopper=True)
    assert big and not any(c.split_k > 1 or c.swap_ab for c in big)
    not_hopper = engine_space.stage1(1024, 4096, 1, sms=132, hopper=False)
    assert not any(c.split_k > 1 or c.swap_ab for c in not_hopper)
    for c in small:
        for r in engine_space.refine(c, 1024, 4096, 1, 132, True):
            assert engine_space.keep(r, 1024, 4096, 1, 132, True, engine_space.DeviceLimits())


def test_verify_exits_nonzero_when_a_tuned_config_fails(tmp_path):
    import os
    import subprocess
    import sys
    ok = {**BASE, "BLOCK_SIZE_N": 32, "num_stages": 2}
    # within the engines' limits, but 4 splits of K=256's two scale groups cannot launch
    bad = {**BASE, "BLOCK_SIZE_N": 32, "num_stages": 2, "SPLIT_K": 4}
    F.merge_write_config(tmp_path / F.config_file_name("sglang", 128, 256, F.CPU_DEVICE_NAME),
                         {1: ok, 64: bad})
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-m", "servelab", "tune", "verify", str(tmp_path),
                          "--device", "cpu", "--kernel", "servelab", "--shipped", str(shipped),
                          "--batch-sizes", "1,64"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "FAILED: 1 tuned config(s) did not launch, first N=128,K=256,M=64" in out.stdout
