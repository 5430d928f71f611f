"""`tune install`: the engine's own lookup finds what it installs and `--restore` brings back
the shipped files; a malformed file copies nothing; the engine's folder is looked up in the named
interpreter (the tests that need SGLang: tests/lib/fp8_engines.py).

Its bad input and messages. Before: installing a folder into itself
(`--dest` the tuned folder) "backed up" the tuned file as if the engine had shipped it and
offered a restore that would only delete it, and where the engine was not importable the
confirmation step said "use --kernel servelab", an option `install` does not have."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cli_inproc import cli
from fp8_engines import BASE, H200, need_engine_dir

from servelab.errors import UserError
from servelab.kernels.fp8_gemm import engine as EK
from servelab.kernels.fp8_gemm import formats
from servelab.tune import install
from servelab.tune import verify as V

TUNED = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
         "num_warps": 4, "num_stages": 2}


def _tuned_dir(tmp_path: Path) -> Path:
    d = tmp_path / "tuned"
    d.mkdir()
    formats.merge_write_config(d / formats.config_file_name("sglang", 128, 256, "NVIDIA H200"),
                               {1: TUNED})
    return d


def test_installing_a_folder_into_itself_is_refused_and_leaves_it_alone(tmp_path):
    src = _tuned_dir(tmp_path)
    before = sorted(p.name for p in src.iterdir())
    with pytest.raises(UserError, match="is the folder of tuned files itself"):
        install.install(src, "sglang", tmp_path / "tuned" / ".." / "tuned")
    assert sorted(p.name for p in src.iterdir()) == before      # no backup folder made


def test_install_without_the_engine_here_names_python_not_kernel(tmp_path, monkeypatch, capsys):
    if EK.package_dir("sglang") is not None:
        pytest.skip("sglang is importable here: its lookup is asked")
    dest = tmp_path / "dest"
    dest.mkdir()
    code, out, _ = cli(monkeypatch, capsys, "tune", "install", str(_tuned_dir(tmp_path)),
                       "--engine", "sglang", "--dest", str(dest))
    assert code == 0 and "installed " in out, out
    line = next(s for s in out.splitlines() if s.startswith("not checked"))
    assert "--kernel" not in line and "--python" in line, line
    assert "sglang is not installed in this interpreter" in line


def test_install_and_restore_print_one_json_document(tmp_path, monkeypatch, capsys):
    # --json: the result on stdout (the files put in place, what the engine's lookup said, the
    # undo command), the human lines on stderr; then --restore --json puts the folder back
    import json

    dest = tmp_path / "dest"
    dest.mkdir()
    name = formats.config_file_name("sglang", 128, 256, "NVIDIA H200")
    (dest / name).write_text('{"1": {"BLOCK_SIZE_M": 64}}')  # a "shipped" file it replaces
    code, out, err = cli(monkeypatch, capsys, "tune", "install", str(_tuned_dir(tmp_path)),
                         "--engine", "sglang", "--dest", str(dest), "--json")
    doc = json.loads(out)
    assert doc["schema"] == "servelab.tune_install/1" and doc["action"] == "install"
    assert doc["files"] == [{"path": str(dest / name), "replaced": True}]
    assert formats.read_config_file(dest / name) == {1: TUNED}
    assert doc["undo"] == f"servelab tune install --engine sglang --restore --dest {dest}"
    assert "installed " in err and "undo with" in err
    if EK.package_dir("sglang") is None:  # no engine here: said, not checked, not a failure
        assert code == 0 and doc["lookup"]["checked"] is False
        assert "sglang is not installed" in doc["lookup"]["error"]
    code, out, err = cli(monkeypatch, capsys, "tune", "install", "--engine", "sglang",
                         "--dest", str(dest), "--restore", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["action"] == "restore" and doc["lookup"] is None
    assert doc["files"] == [{"path": str(dest / name), "replaced": True}]
    assert (dest / name).read_text() == '{"1": {"BLOCK_SIZE_M": 64}}'
    assert "restored " in err


def _engine_copy(tmp_path: Path, device: str) -> tuple[object, Path]:
    """SGLang's kernel file run from a folder of our own, so its own lookup reads `configs/`
    there (the lookup is relative to the file) and nothing installed is touched."""
    src = need_engine_dir("sglang").parent / "fp8_kernel.py"
    pkg = tmp_path / "gemm"
    (pkg / "configs").mkdir(parents=True)
    shutil.copy(src, pkg / "fp8_kernel.py")
    mod = EK._exec_file(pkg / "fp8_kernel.py", "sgl_copy_fp8",
                        EK._stub_sglang_helpers(lambda: device))
    return mod, pkg / "configs"


def test_sglang_lookup_finds_installed_files_and_restore_brings_back_the_shipped(tmp_path):
    mod, folder = _engine_copy(tmp_path, H200)
    shipped = {"1": {**BASE, "num_stages": 5}}
    name = formats.config_file_name("sglang", 4096, 512, H200)
    (folder / name).write_text(json.dumps(shipped))        # the engine ships this shape
    tuned_dir = tmp_path / "tuned"
    tuned_dir.mkdir()
    tuned = {1: {**BASE, "num_stages": 4, "SPLIT_K": 2}, 64: {**BASE, "num_stages": 3}}
    formats.merge_write_config(tuned_dir / name, tuned)
    formats.merge_write_config(tuned_dir / formats.config_file_name("sglang", 1024, 4096, H200), tuned)
    formats.merge_write_config(tuned_dir / formats.config_file_name("vllm", 1024, 4096, H200), tuned)
    done = install.install(tuned_dir, "sglang", folder)
    assert sorted((d.name, d.replaced) for d in done) == sorted(
        [(name, True), (formats.config_file_name("sglang", 1024, 4096, H200), False)])
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
    formats.merge_write_config(src / formats.config_file_name("sglang", 1024, 4096, H200), {1: BASE})
    (src / formats.config_file_name("sglang", 2048, 4096, H200)).write_text('{"1": {"BLOCK_SIZE_M": 16}}')
    with pytest.raises(UserError, match="malformed.*nothing installed"):
        install.install(src, "sglang", folder)
    assert list(folder.iterdir()) == []


def test_engine_folder_is_looked_up_in_the_named_interpreter():
    import sys
    if EK.package_dir("sglang") is not None:
        pytest.skip("sglang is importable here")
    with pytest.raises(UserError, match="not installed in .*--python"):
        install.engine_config_dir("sglang", sys.executable)
