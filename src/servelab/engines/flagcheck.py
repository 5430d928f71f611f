"""The engine's own parser is the judge of a planned command line.

`judge(engine, role, args, launcher)` asks, in order:
  1. the engine's parser itself, run in the engine's interpreter (the launcher's: its venv or
     container) by engines/parser_probe.py: a verdict there is exactly what the engine says;
  2. where the engine cannot be imported there, the flag table generated from that engine
     version's parser (engines/flags/<engine>-<role>-<version>.json, scripts/gen_engine_flags.py),
     read the way argparse reads a command line: exact names, unique prefixes (argparse's
     abbreviations: `--cuda-graph-max-bs` is ambiguous in SGLang 0.5.23), value counts and
     choices. The verdict names the table and its version.
Nothing here is a hand-written list of flags.
"""

from __future__ import annotations

import difflib
import functools
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servelab.engines.launcher import Launcher

TABLE_DIR = Path(__file__).parent / "flags"
PROBE = Path(__file__).with_name("parser_probe.py")
PROBE_TIMEOUT_S = 180.0


@dataclass(frozen=True, slots=True)
class Verdict:
    """What judged a command line and what it said (error None: accepted)."""

    ok: bool
    error: str | None
    by: str                      # "sglang 0.5.23 parser in /venv/bin/python" or "table ..."
    version: str | None = None


def _version_key(v: str) -> tuple[int | str, ...]:
    return tuple(int(x) if x.isdigit() else x for x in v.replace("-", ".").split("."))


def tables(engine: str, role: str) -> dict[str, Path]:
    """Generated tables for (engine, role) by version."""
    base = "router" if role == "router" else "server"
    out = {}
    for p in TABLE_DIR.glob(f"{engine}-{base}-*.json"):
        out[p.stem.split("-", 2)[2]] = p
    return dict(sorted(out.items(), key=lambda kv: _version_key(kv[0])))


@functools.cache
def load_table(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def table_check(table: dict[str, Any], args: list[str]) -> str | None:
    """argparse's first error for `args` under the table's options (None: accepted)."""
    opts: dict[str, dict[str, Any]] = table["options"]
    names = sorted(opts)
    positional_room = sum(1 if p["nargs"] in (None, "?") else 10**6 for p in table["positionals"])
    unrecognized: list[str] = []
    i = 0
    while i < len(args):
        tok = args[i]
        i += 1
        if not tok.startswith("--") or tok == "--":
            if positional_room > 0:
                positional_room -= 1
            else:
                unrecognized.append(tok)
            continue
        name, eq, val = tok.partition("=")
        if name in opts:
            opt = name
        else:
            hits = [n for n in names if n.startswith(name)] if table.get("allow_abbrev") else []
            if len(hits) > 1:
                return f"ambiguous option: {name} could match {', '.join(hits)}"
            if not hits:
                unrecognized.append(tok)
                while i < len(args) and not args[i].startswith("--"):
                    unrecognized.append(args[i])
                    i += 1
                continue
            opt = hits[0]
        rec = opts[opt]
        shown_as = "/".join(rec.get("names") or [opt])       # argparse names all its strings
        values: list[str] = []
        if eq:
            if not rec["takes_value"]:
                return f"argument {shown_as}: ignored explicit argument '{val}'"
            values = [val]
        elif rec["takes_value"]:
            nargs = rec["nargs"]
            counts = {None: (1, 1), "?": (0, 1), "*": (0, 10**6), "+": (1, 10**6)}
            want_min, want_max = counts[nargs] if nargs in counts else (int(nargs),) * 2
            while i < len(args) and len(values) < want_max and not args[i].startswith("--"):
                values.append(args[i])
                i += 1
            if len(values) < want_min:
                need = {1: "one argument", None: "one argument"}.get(want_min,
                                                                     "at least one argument")
                return f"argument {shown_as}: expected {need}"
        if rec["choices"] is not None:
            for v in values:
                if v not in [str(c) for c in rec["choices"]]:
                    shown = ", ".join(repr(str(c)) for c in rec["choices"])
                    return f"argument {shown_as}: invalid choice: {v!r} (choose from {shown})"
    if unrecognized:
        first = unrecognized[0].partition("=")[0]
        near = difflib.get_close_matches(first, names, n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        return f"unrecognized arguments: {' '.join(unrecognized)}{hint}"
    return None


@functools.cache
def _probe(cmd: tuple[str, ...]) -> dict[str, Any] | None:
    """Run the parser probe; its JSON answer, or None when it could not run at all."""
    try:
        out = subprocess.run(list(cmd), capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    line = (out.stdout.strip().splitlines() or [""])[-1]
    try:
        return json.loads(line)
    except ValueError:
        return None


def probe_command(engine: str, role: str, args: list[str], launcher: Launcher) -> list[str]:
    """The command that asks the engine's parser about `args` where the engine lives (the
    probe's source is passed with -c, so it runs in a container too)."""
    interp = launcher.interpreter() or ["python3"]
    kind = "router" if role == "router" else "server"
    return [*interp, "-c", PROBE.read_text(), "check", engine, kind, "--", *args]


def judge(engine: str, role: str, args: list[str], launcher: Launcher | None = None,
          version: str | None = None, use_engine: bool = True) -> Verdict:
    """The verdict on one process's engine arguments (see the module docstring). `version`
    picks the table when the engine cannot be asked (default: the newest generated)."""
    launcher = launcher or Launcher()
    name = "sglang-router" if (engine, role) == ("sglang", "router") else engine
    if use_engine:
        got = _probe(tuple(probe_command(engine, role, args, launcher)))
        if got is not None and "ok" in got:
            where = " ".join(launcher.interpreter() or [])
            return Verdict(bool(got["ok"]), got.get("error"),
                           f"{name} {got.get('version') or '?'} parser "
                           f"({got.get('parser')}) in {where}", got.get("version"))
    found = tables(engine, role)
    if not found:
        return Verdict(True, None, f"unchecked: no generated table for {engine} {role}")
    if version is not None and version not in found:
        raise ValueError(f"no generated flag table for {engine} {version} "
                         f"(have: {', '.join(found)}); generate one with "
                         "scripts/gen_engine_flags.py")
    ver = version or next(reversed(found))
    table = load_table(found[ver])
    err = table_check(table, args)
    return Verdict(err is None, err, f"generated table {found[ver].name} "
                   f"({name} {table.get('version')}; not importable in "
                   f"{' '.join(launcher.interpreter() or [])})", ver)
