"""`tune install`'s bad input and its messages. Before: installing a folder into itself
(`--dest` the tuned folder) "backed up" the tuned file as if the engine had shipped it and
offered a restore that would only delete it, and where the engine was not importable the
confirmation step said "use --kernel servelab", an option `install` does not have."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_inproc import cli

from servelab.errors import UserError
from servelab.kernels.fp8_gemm import engine as EK
from servelab.kernels.fp8_gemm import formats
from servelab.tune import install

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
