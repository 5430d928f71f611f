"""`tune install`: the engine's own lookup finds what it installs and `--restore` brings back
the shipped files; a malformed file copies nothing; the engine's folder is looked up in the named
interpreter (the tests that need SGLang: tests/lib/fp8_engines.py).

Its bad input and messages. Before: installing a folder into itself
(`--dest` the tuned folder) "backed up" the tuned file as if the engine had shipped it and
offered a restore that would only delete it, and where the engine was not importable the
confirmation step said "use --kernel servelab", an option `install` does not have.

Confined: `tune install` and `--restore` never create, change or delete a path outside the
engine's config folder, whatever the manifest or the links in the folder say. Before: a manifest entry
`../outside/f` or an absolute path made restore delete or overwrite that file, a planted
`.servelab-backup/<name>` link was written through, a `.servelab-backup` linking outside received
the backup and manifest, and one missing backup made every later restore fail before it
restored anything."""

from __future__ import annotations

import json
import os
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


NAMES = [formats.config_file_name("sglang", n, 256, "NVIDIA H200") for n in (128, 256)]


def _confined_tree(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A tuned folder with two files, an engine folder shipping the first, and a folder
    outside holding a file whose bytes must never change."""
    tuned, dest, outside = tmp_path / "tuned", tmp_path / "engine", tmp_path / "outside"
    for d in (tuned, dest, outside):
        d.mkdir()
    for name in NAMES:
        formats.merge_write_config(tuned / name, {1: TUNED})
    (dest / NAMES[0]).write_text('{"1": "shipped"}')
    (outside / "f").write_text("precious")
    return tuned, dest, outside


def _snapshot(folder: Path) -> dict[str, bytes | str]:
    out: dict[str, bytes | str] = {}
    for p in sorted(folder.rglob("*")):
        out[str(p.relative_to(folder))] = (f"link:{os.readlink(p)}" if p.is_symlink()
                                           else p.read_bytes() if p.is_file() else "dir")
    return out


@pytest.mark.parametrize("hostile", ["../outside/f", "{outside}/f", "..", "x/../../outside/f"])
@pytest.mark.parametrize("replaced", [True, False])
def test_a_hostile_manifest_entry_is_never_acted_on(tmp_path, hostile, replaced):
    tuned, dest, outside = _confined_tree(tmp_path)
    install.install(tuned, "sglang", dest)
    manifest_path = dest / install.BACKUP_DIR / install.MANIFEST
    manifest = json.loads(manifest_path.read_text())
    name = hostile.format(outside=outside)
    manifest[name] = {"replaced": replaced}
    manifest_path.write_text(json.dumps(manifest))
    (dest / install.BACKUP_DIR / "f").write_text("planted")   # what a replaced restore would write
    before = _snapshot(outside)
    back = install.restore(dest)
    assert _snapshot(outside) == before
    assert sorted(f.name for f in back.done) == sorted(NAMES)
    assert [n for n, _ in back.failed] == [name]
    assert (dest / NAMES[0]).read_text() == '{"1": "shipped"}'      # the good entries restored
    assert not (dest / NAMES[1]).exists()


def test_links_in_the_folder_are_never_written_through(tmp_path):
    tuned, dest, outside = _confined_tree(tmp_path)
    before = _snapshot(outside)
    backup = dest / install.BACKUP_DIR
    backup.mkdir()
    (backup / NAMES[0]).symlink_to(outside / "f")           # a planted backup file
    with pytest.raises(UserError, match="link"):
        install.install(tuned, "sglang", dest)
    (backup / NAMES[0]).unlink()
    (dest / NAMES[1]).symlink_to(outside / "f")             # a destination file linking outside
    with pytest.raises(UserError, match="link"):
        install.install(tuned, "sglang", dest)
    (dest / NAMES[1]).unlink()
    backup.rmdir()
    backup.symlink_to(outside)                              # the backup folder itself
    with pytest.raises(UserError, match="link"):
        install.install(tuned, "sglang", dest)
    with pytest.raises(UserError, match="link"):
        install.restore(dest)
    assert _snapshot(outside) == before
    assert (dest / NAMES[0]).read_text() == '{"1": "shipped"}'


def test_a_missing_backup_restores_the_rest_and_keeps_its_entry(tmp_path):
    tuned, dest, _ = _confined_tree(tmp_path)
    install.install(tuned, "sglang", dest)
    (dest / install.BACKUP_DIR / NAMES[0]).unlink()
    back = install.restore(dest)
    assert [f.name for f in back.done] == [NAMES[1]] and not (dest / NAMES[1]).exists()
    assert [n for n, _ in back.failed] == [NAMES[0]] and "missing" in back.failed[0][1]
    kept = json.loads((dest / install.BACKUP_DIR / install.MANIFEST).read_text())
    assert kept == {NAMES[0]: {"replaced": True}}


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, '{"a": 1}', "[]", "not json",
                                  '{"x": {"replaced": "yes"}}'])
def test_a_malformed_manifest_is_one_line(tmp_path, text):
    tuned, dest, _ = _confined_tree(tmp_path)
    (dest / install.BACKUP_DIR).mkdir()
    (dest / install.BACKUP_DIR / install.MANIFEST).write_text(text)
    for call in (lambda: install.restore(dest), lambda: install.install(tuned, "sglang", dest)):
        with pytest.raises(UserError, match="manifest") as err:
            call()
        assert "\n" not in str(err.value)


@pytest.mark.parametrize(("key", "value"), [
    ("BLOCK_SIZE_M", 10**100), ("BLOCK_SIZE_N", 48), ("BLOCK_SIZE_K", 1024), ("num_warps", 10**6),
    ("num_warps", 3), ("num_stages", 64), ("GROUP_SIZE_M", 10**9), ("SPLIT_K", 3)])
def test_install_refuses_entries_no_engine_can_launch(tmp_path, key, value):
    tuned, dest, _ = _confined_tree(tmp_path)
    name = formats.config_file_name("sglang", 512, 256, "NVIDIA H200")
    (tuned / name).write_text(json.dumps({"1": {**TUNED, key: value}}))
    before = _snapshot(dest)
    with pytest.raises(UserError, match=f"malformed config file, nothing installed: .*{key}"):
        install.install(tuned, "sglang", dest)
    assert _snapshot(dest) == before


def test_tiles_beyond_any_gpus_shared_memory_are_refused():
    big = {**TUNED, "BLOCK_SIZE_M": 512, "BLOCK_SIZE_N": 512, "BLOCK_SIZE_K": 256}
    with pytest.raises(ValueError, match="shared memory"):
        formats.validate_entry(big, "e")
    assert formats.validate_entry({**TUNED, "BLOCK_SIZE_M": 256, "BLOCK_SIZE_N": 256,
                                   "BLOCK_SIZE_K": 256, "num_stages": 4}, "e")["num_stages"] == 4
