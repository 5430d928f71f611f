"""`tune install` and `--restore` never create, change or delete a path outside the engine's
config folder, whatever the manifest or the links in the folder say. Before: a manifest entry
`../outside/f` or an absolute path made restore delete or overwrite that file, a planted
`.servelab-backup/<name>` link was written through, a `.servelab-backup` linking outside received
the backup and manifest, and one missing backup made every later restore fail before it
restored anything."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from servelab.errors import UserError
from servelab.kernels.fp8_gemm import formats
from servelab.tune import install

TUNED = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
         "num_warps": 4, "num_stages": 2}
NAMES = [formats.config_file_name("sglang", n, 256, "NVIDIA H200") for n in (128, 256)]


def _tree(tmp_path: Path) -> tuple[Path, Path, Path]:
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
    tuned, dest, outside = _tree(tmp_path)
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
    tuned, dest, outside = _tree(tmp_path)
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
    tuned, dest, _ = _tree(tmp_path)
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
    tuned, dest, _ = _tree(tmp_path)
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
    tuned, dest, _ = _tree(tmp_path)
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
