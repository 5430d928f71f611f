"""The engines' own config lookups find every file `servelab tune` writes and `tune install`
puts in place: SGLang's and vLLM's `get_w8a8_block_fp8_configs`, called (tune/engine_lookup.py),
not a copy of their file-name expression.

Without an engine (CI) the files are checked against the tables generated from those lookups
(kernels/fp8_gemm/lookups/, scripts/gen_engine_flags.py lookup). Against the real engines
(docs/TUNING.md, "Checking against the engines"):
  SERVELAB_VLLM_PYTHON=/path/to/vllm-venv/bin/python \\
  SERVELAB_SGLANG_PYTHON=/path/to/sglang-venv/bin/python \\
  PYTHONPATH=src python -m pytest tests/tune/test_engine_lookup.py tests/engines/test_vllm.py
(an interpreter that can import the engine, or that has the engine's unpacked wheel on its
path: where `vllm`/`sglang` do not import, their kernel files run with host helpers supplied).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from interpreter import interpreter_or_skip

from servelab.kernels.fp8_gemm import formats as F
from servelab.tune import engine_lookup, install, job

interpreter_or_skip("tests/tune/test_engine_lookup.py")

LOOKUPS = Path(F.__file__).with_name("lookups")
PYTHONS = {"sglang": os.environ.get("SERVELAB_SGLANG_PYTHON"),
           "vllm": os.environ.get("SERVELAB_VLLM_PYTHON")}
# device names as torch/NVML report them, to stress each engine's own spelling
DEVICES = ("NVIDIA H200", "NVIDIA  RTX PRO 6000", "NVIDIA A100-SXM4-80GB")


def _table(engine: str) -> dict:
    """The newest generated lookup table of `engine`."""
    paths = sorted(LOOKUPS.glob(f"{engine}-*.json"))
    assert paths, f"no generated lookup table for {engine} in {LOOKUPS}"
    return json.loads(paths[-1].read_text())


def _python(engine: str) -> str:
    py = PYTHONS[engine]
    if not py:
        pytest.skip(f"no interpreter with {engine}: set SERVELAB_{engine.upper()}_PYTHON "
                    "(this module's docstring)")
    return py


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> Path:
    """What `servelab tune fp8-gemm --device cpu --format both` writes (interpreter, tiny
    space), for two shapes."""
    out = tmp_path_factory.mktemp("tuned")
    spec = job.TuneSpec(shapes=((128, 256), (256, 128)), out_dir=out, batch_sizes=(1, 16),
                        device="cpu", name="lookup1", kernel="servelab")
    rep = job.run(spec, echo=lambda s: None)
    assert not rep.failed and len(rep.files) == 6
    return out


def _engine_files(folder: Path, engine: str) -> list[Path]:
    return sorted(p for p in folder.iterdir()
                  if (pn := F.parse_file_name(p.name)) is not None and pn.fmt == engine)


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_servelab_spells_device_names_as_each_engines_lookup_does(engine):
    table = _table(engine)
    assert table["function"] == "get_w8a8_block_fp8_configs" and table["version"]
    for raw, spelt in table["device_spelling"].items():       # what the engine itself did
        assert F.device_file_name(raw, engine) == spelt, (engine, raw)
        assert F.config_file_name(engine, 4096, 512, raw) == table["file_name"].format(
            N=4096, K=512, device=spelt)


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_every_file_tune_writes_is_the_one_the_generated_table_says_is_read(tuned, engine):
    table = _table(engine)
    side = {json.loads(p.read_text())["device_name"] for p in tuned.glob("*.servelab.json")}
    (raw,) = side
    files = _engine_files(tuned, engine)
    assert len(files) == 2
    for p in files:
        pn = F.parse_file_name(p.name)
        assert p.name == table["file_name"].format(
            N=pn.n, K=pn.k, device=table["device_spelling"].get(raw) or F.device_file_name(
                raw, engine))
        if "launch_keys" in table:                # every key reaches the engine's kernel
            for m, entry in F.read_config_file(p).items():
                assert set(entry) <= set(table["launch_keys"]), (p.name, m, entry)


def test_a_vllm_file_is_not_written_with_keys_vllms_kernel_does_not_read(tmp_path):
    spec = job.TuneSpec(shapes=((128, 256),), out_dir=tmp_path, batch_sizes=(1, 16),
                        device="cpu", name="lookup2")
    cfg = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
           "num_warps": 4, "num_stages": 3}
    units = {(128, 256, 1): {"best": {**cfg, "SPLIT_K": 4, "SWAP_AB": True}, "us": 1.0},
             (128, 256, 16): {"best": cfg, "us": 2.0}}
    info = {"device_name": "NVIDIA H200", "triton": "x", "torch": "y",
            "kernel_extra_keys": frozenset({"SPLIT_K", "SWAP_AB"})}    # SGLang's launcher
    vllm_name = F.config_file_name("vllm", 128, 256, "NVIDIA H200")
    plain = {(128, 256, 16): units[(128, 256, 16)]}
    mid = [p.name for p in job._write_shape(spec, info, 128, 256, plain, final=False)]
    assert vllm_name not in mid and not (tmp_path / vllm_name).exists()   # no partial file
    written = job._write_shape(spec, info, 128, 256, units)
    names = [p.name for p in written]
    assert F.config_file_name("sglang", 128, 256, "NVIDIA H200") in names
    assert F.config_file_name("vllm", 128, 256, "NVIDIA H200") not in names
    assert not (tmp_path / F.config_file_name("vllm", 128, 256, "NVIDIA H200")).exists()
    (note,) = info["notes"]
    assert "M=[1]" in note and "SPLIT_K" in note and "--kernel vllm --format vllm" in note


def test_install_says_when_the_engines_lookup_could_not_be_asked(tuned, tmp_path, monkeypatch,
                                                                 capsys):
    from cli_inproc import cli

    from servelab.kernels.fp8_gemm import engine as EK
    if EK.package_dir("vllm") is not None:
        pytest.skip("vllm is importable here: the next test covers it")
    dest = tmp_path / "dest"
    dest.mkdir()
    code, out, _ = cli(monkeypatch, capsys, "tune", "install", str(tuned), "--engine", "vllm",
                       "--dest", str(dest))
    assert code == 0 and out.count("installed /") == 2, out
    assert "not checked with vllm's own lookup: vllm is not installed in this interpreter" in out


# ---- against the real engines --------------------------------------------------------------


def test_install_exits_1_when_the_engines_lookup_misses_an_installed_file(tuned, tmp_path,
                                                                          monkeypatch, capsys):
    from cli_inproc import cli
    py = _python("vllm")
    src, dest = tmp_path / "src", tmp_path / "dest"
    dest.mkdir()
    shutil.copytree(tuned, src)
    good = _engine_files(src, "vllm")[0]
    bad = src / good.name.replace(F.CPU_DEVICE_NAME, "NVIDIA H200")   # a space: vLLM spells
    shutil.copy(good, bad)                                          # it NVIDIA_H200
    code, out, _ = cli(monkeypatch, capsys, "tune", "install", str(src), "--engine", "vllm",
                       "--dest", str(dest), "--python", py)
    assert "vllm's own lookup finds 2 of 3 installed files: vllm 0.33.0" in out, out
    assert f"NOT FOUND by vllm's lookup: {bad.name}" in out and code == 1


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_the_engines_own_lookup_reads_every_file_tune_writes(tuned, tmp_path, engine):
    py = _python(engine)
    raw = F.CPU_DEVICE_NAME
    files = _engine_files(tuned, engine)
    folder = tmp_path / "out"
    shutil.copytree(tuned, folder)
    for dev in DEVICES:          # the same entries as if tuned on GPUs with awkward names
        for p in files:
            pn = F.parse_file_name(p.name)
            shutil.copy(p, folder / F.config_file_name(engine, pn.n, pn.k, dev))
    queries = [(F.parse_file_name(p.name).n, F.parse_file_name(p.name).k, dev)
               for dev in (raw, *DEVICES) for p in files]
    got = engine_lookup.lookup_in(py, engine, queries, folder)
    assert got["function"].endswith(":get_w8a8_block_fp8_configs")
    for (n, k, dev), read, entries in zip(queries, got["read"], got["found"], strict=True):
        want = folder / F.config_file_name(engine, n, k, dev)
        assert read == str(want.resolve()), (engine, dev, read)
        assert sorted(map(int, entries)) == sorted(F.read_config_file(want)), (engine, dev)
        if engine == "vllm":                      # vLLM returns the file as it is
            assert entries == {str(m): e for m, e in F.read_config_file(want).items()}


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_install_target_is_the_folder_the_engines_lookup_reads(tuned, tmp_path, engine):
    py = _python(engine)
    target = install.engine_config_dir(engine, py)           # `tune install --engine` goes here
    shipped = F.config_file_name(engine, 4096, 512, "NVIDIA H200")
    assert (target / shipped).is_file()                      # both engines ship this shape
    got = engine_lookup.lookup_in(py, engine, [(4096, 512, "NVIDIA H200")])   # own folder
    assert got["read"] == [str((target / shipped).resolve())]
    # install into a copy of that folder; the engine's lookup (pointed at the copy) finds
    # every installed file, and after restore only what the engine shipped
    dest = tmp_path / "configs"
    shutil.copytree(target, dest, ignore=shutil.ignore_patterns(".servelab-backup"))
    extra = tuned / shipped
    shutil.copy(dest / shipped, extra)                       # one tuned file replaces a shipped
    try:
        done = install.install(tuned, engine, dest)
        assert {d.name: d.replaced for d in done}[shipped] is True
        ok = install.confirm(engine, dest, [d.name for d in done], py, own_folder=False)
        assert sorted(ok.found) == sorted(d.name for d in done) and not ok.missing, ok
        install.restore(dest)
        back = install.confirm(engine, dest, [d.name for d in done], py, own_folder=False)
        assert back.found == [shipped], back                 # the others are gone again
    finally:
        extra.unlink()


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_the_generated_table_is_what_the_engine_does_now(engine):
    py = _python(engine)
    import subprocess
    out = subprocess.run([py, str(Path(engine_lookup.__file__)), f"record:{engine}"],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "SERVELAB_SRC": str(engine_lookup.SRC)})
    assert out.returncode == 0, out.stderr[-2000:]
    now = json.loads(out.stdout.strip().splitlines()[-1])
    table = json.loads((LOOKUPS / f"{engine}-{now['version']}.json").read_text())
    for key in ("file_name", "device_spelling", "folder", "source", "launch_keys"):
        assert now.get(key) == table.get(key), key
