"""`servelab tune install DIR --engine sglang|vllm`: put tuned config files where the installed
engine reads them, keeping what they replace, and `--restore` to put that back.

The folder is the engine's own (kernels/fp8_gemm/engine.config_dir: SGLang 0.5.23
sglang/kernels/ops/gemm/configs/, vLLM vllm/model_executor/layers/quantization/utils/configs/),
found in this interpreter or in the one `python` names (the engine's own venv or container
entry). Both engines ship files for some shapes (SGLang 0.5.23: 29 block-FP8 files for
NVIDIA_H200): a shipped file that a tuned one replaces is copied into
`.servelab-backup/` beside it first, once, and the manifest there says which files were
replaced and which were new, so `restore` returns the folder to what the engine shipped.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from servelab import atomic
from servelab.errors import UserError
from servelab.kernels.fp8_gemm import engine as engine_kernel
from servelab.kernels.fp8_gemm import formats
from servelab.tune import engine_lookup

BACKUP_DIR = ".servelab-backup"
MANIFEST = "manifest.json"


@dataclass(frozen=True, slots=True)
class Installed:
    """One file put in place: where, and whether it replaced a shipped file."""

    name: str
    replaced: bool


def engine_config_dir(engine: str, python: str | None = None) -> Path:
    """The engine's config folder, in this interpreter or in `python`'s; UserError when the
    engine is not installed there."""
    if engine not in engine_kernel.ENGINES:
        raise UserError(f"--engine {engine}: choose one of {', '.join(engine_kernel.ENGINES)}")
    if python is None:
        found = engine_kernel.config_dir(engine)
    else:
        code = ("import sys; from servelab.kernels.fp8_gemm.engine import config_dir; "
                f"d = config_dir({engine!r}); print(d if d else '')")
        src = str(Path(__file__).resolve().parents[2])
        try:
            out = subprocess.run([python, "-c", f"import sys; sys.path.insert(0, {src!r}); {code}"],
                                 capture_output=True, text=True, timeout=60)
        except OSError as exc:
            raise UserError(f"--python {python}: cannot run it ({exc.strerror})") from None
        if out.returncode != 0:
            tail = (out.stderr.strip().splitlines() or [""])[-1]
            raise UserError(f"--python {python}: could not look for {engine}: {tail}")
        found = Path(out.stdout.strip()) if out.stdout.strip() else None
    if found is None:
        where = python or "this interpreter"
        raise UserError(f"{engine} is not installed in {where}; name the engine's interpreter "
                        "with --python, or its folder with --dest")
    return found


@dataclass(frozen=True, slots=True)
class Confirmed:
    """What the engine's own lookup found after an install (engine_lookup.py)."""

    found: list[str]
    missing: list[str]           # installed, but the engine's lookup reads another file or none
    by: str                      # which function, loaded how


def confirm(engine: str, dest: Path, names: list[str], python: str | None = None,
            own_folder: bool = True) -> Confirmed:
    """Ask the engine's own `get_w8a8_block_fp8_configs` (in `python`, or here) for every
    installed file, under the device name the file is for: found when it reads that very file
    and returns its batch sizes (the engines may adjust an entry as they read it: SGLang off
    CUDA raises BLOCK_SIZE_K to the quantization block). `own_folder` False: `dest` is not the
    engine's installed folder, so its lookup is pointed at it. RuntimeError when the lookup
    cannot run there."""
    queries = []
    for name in names:
        pn = formats.parse_file_name(name)
        assert pn is not None, name                 # install() copied only parsed names
        queries.append((pn.n, pn.k, pn.device))
    got = engine_lookup.lookup_in(python, engine, queries, None if own_folder else dest)
    found, missing = [], []
    for name, entries, read in zip(names, got["found"], got["read"], strict=True):
        path = dest / name
        same_file = read is not None and path.exists() and Path(read) == path.resolve()
        ok = same_file and entries is not None and sorted(map(int, entries)) == sorted(
            formats.read_config_file(path))
        (found if ok else missing).append(name)
    return Confirmed(found, missing, f"{engine} {got['version']} {got['function']} "
                                     f"({got['how']})")


def _plain_name(name: object) -> bool:
    """A manifest entry may name only an engine config file of the folder itself: no path
    separators, no `..`, nothing but what `install` copies."""
    return (isinstance(name, str) and name == Path(name).name and name not in (".", "..")
            and "\\" not in name and "\0" not in name
            and formats.parse_file_name(name) is not None)


def _backup_dir(dest: Path) -> Path:
    """`dest/.servelab-backup`, refused when it is a link or not a folder: its files are
    written and deleted, so it must be the folder's own."""
    backup = dest / BACKUP_DIR
    if backup.is_symlink() or (backup.exists() and not backup.is_dir()):
        raise UserError(f"{backup} is a link or not a folder; servelab writes only inside "
                        f"{dest}: remove it and run again")
    return backup


def _manifest(dest: Path) -> dict[str, dict[str, object]]:
    """The manifest of earlier installs; UserError (one line) when it is not servelab's."""
    path = _backup_dir(dest) / MANIFEST
    if not path.exists():
        return {}
    if path.is_symlink() or not path.is_file():
        raise UserError(f"{path} is a link or not a file; remove it and run again")
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise UserError(f"{path}: not a manifest servelab wrote ({type(exc).__name__}); "
                        "remove it and run again") from None
    if not isinstance(raw, dict) or not all(
            isinstance(v, dict) and isinstance(v.get("replaced"), bool) for v in raw.values()):
        raise UserError(f"{path}: not a manifest servelab wrote (expected "
                        '{"<file name>": {"replaced": true|false}}); remove it and run again')
    return raw


def _refuse_links(dest: Path, backup: Path, names: list[str]) -> None:
    links = [p for name in names for p in (dest / name, backup / name) if p.is_symlink()]
    if links:
        raise UserError(f"{links[0]} is a link; servelab never writes through links (nothing "
                        "installed): remove it and run again")


def install(src: Path, engine: str, dest: Path) -> list[Installed]:
    """Copy every `engine`-format config file of `src` into `dest` (see the module docstring).
    Files are validated first: nothing is copied if one is malformed."""
    if not src.is_dir():
        raise UserError(f"{src}: not a folder; give the --out folder of a tuning run")
    files = [p for p in sorted(src.iterdir())
             if (pn := formats.parse_file_name(p.name)) is not None and pn.fmt == engine]
    if not files:
        raise UserError(f"{src}: no {engine} config files (N=...,K=...,device_name=...,"
                        f"dtype=fp8_w8a8,block_shape=[...].json in {engine}'s spelling)")
    for p in files:
        try:
            formats.read_config_file(p)
        except ValueError as exc:
            raise UserError(f"malformed config file, nothing installed: {exc}") from None
    if not dest.is_dir():
        raise UserError(f"{dest}: the engine's config folder does not exist")
    if dest.resolve() == src.resolve():   # else its own files would be "backed up" as shipped
        raise UserError(f"{dest} is the folder of tuned files itself; give the engine's config "
                        "folder with --dest (or leave --dest out to find it)")
    backup = _backup_dir(dest)
    manifest = _manifest(dest)
    _refuse_links(dest, backup, [p.name for p in files])
    out = []
    for p in files:
        target = dest / p.name
        if p.name not in manifest:                       # first install over this name
            replaced = target.exists()
            if replaced:
                backup.mkdir(exist_ok=True)
                atomic.write_bytes(backup / p.name, target.read_bytes())
            manifest[p.name] = {"replaced": replaced}
        atomic.write_text(target, p.read_text())
        out.append(Installed(p.name, bool(manifest[p.name]["replaced"])))
    backup.mkdir(exist_ok=True)
    atomic.write_text(backup / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return out


@dataclass(frozen=True, slots=True)
class Restored:
    """What `restore` put back, and what it could not (name, why): those entries stay in the
    manifest, except names that are not the folder's own files, which are never acted on."""

    done: list[Installed]
    failed: list[tuple[str, str]]


def _restore_one(dest: Path, backup: Path, name: str, replaced: bool) -> str | None:
    """Put one entry back; the reason it cannot be, or None."""
    target, saved = dest / name, backup / name
    if target.is_symlink():
        return "the installed file is a link: servelab does not write through it"
    if not replaced:
        target.unlink(missing_ok=True)
        return None
    if saved.is_symlink() or not saved.is_file():
        return f"its backup {saved} is missing or a link"
    atomic.write_bytes(target, saved.read_bytes())
    saved.unlink()
    return None


def restore(dest: Path) -> Restored:
    """Undo every install into `dest`: shipped files back, files the engine never had removed.
    Every entry that can be restored is; the others are listed with why (a missing backup, a
    link, a name outside the folder) and nothing outside `dest` is created, changed or deleted."""
    manifest = _manifest(dest)
    if not manifest:
        raise UserError(f"{dest}: nothing to restore (no {BACKUP_DIR}/{MANIFEST})")
    backup = _backup_dir(dest)
    done: list[Installed] = []
    failed: list[tuple[str, str]] = []
    keep: dict[str, dict[str, object]] = {}
    for name, rec in sorted(manifest.items()):
        if not _plain_name(name):
            failed.append((name, "not a config file of this folder: never acted on"))
            continue
        why = _restore_one(dest, backup, name, bool(rec["replaced"]))
        if why is None:
            done.append(Installed(name, bool(rec["replaced"])))
        else:
            failed.append((name, why))
            keep[name] = rec
    if keep:
        atomic.write_text(backup / MANIFEST, json.dumps(keep, indent=1, sort_keys=True) + "\n")
    else:
        (backup / MANIFEST).unlink()
        if not any(backup.iterdir()):
            backup.rmdir()
    return Restored(done, failed)
