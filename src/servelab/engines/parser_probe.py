"""Ask an engine's own argument parser, in the engine's own interpreter.

Run as a script (standard library only: it runs in the engine's venv or container, where
servelab is usually not installed):

  PY parser_probe.py check ENGINE ROLE -- ARG...   -> {"ok": bool, "error": str | null, ...}
  PY parser_probe.py dump ENGINE ROLE              -> every option the parser knows

ENGINE is sglang or vllm; ROLE is server (prefill/decode use the server's parser) or router.
The parser is built exactly as the engine builds it for its launch command:
  sglang  server: argparse.ArgumentParser + ServerArgs.add_cli_args (sglang.srt.server_args,
          what `prepare_server_args` parses `python -m sglang.launch_server ARGS` with)
          router: sglang_router.launch_router's parser (RouterArgs.add_cli_args)
  vllm    server: the `vllm serve` parser (vllm.entrypoints.common.cli_args.make_arg_parser)
Exit status 0 with a JSON line on stdout; 3 with {"unavailable": reason} when the engine cannot
be imported here (the caller then falls back to the generated tables).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import sys
from typing import Any


class _ParseError(Exception):
    pass


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def build(engine: str, role: str) -> tuple[argparse.ArgumentParser, str, str | None]:
    """(parser, where it comes from, engine version); ImportError when not installed."""
    if engine == "sglang" and role != "router":
        from sglang.srt.server_args import ServerArgs
        p = argparse.ArgumentParser(prog="sglang serve")
        ServerArgs.add_cli_args(p)
        return p, "sglang.srt.server_args.ServerArgs.add_cli_args", _version("sglang")
    if engine == "sglang":
        from sglang_router.router_args import RouterArgs
        p = argparse.ArgumentParser(prog="sglang_router.launch_router")
        RouterArgs.add_cli_args(p, use_router_prefix=False, exclude_host_port=False)
        return p, "sglang_router.router_args.RouterArgs.add_cli_args", _version("sglang-router")
    if engine == "vllm":
        import torch
        if not torch.cuda.is_available():   # vLLM infers its platform while it builds the
            os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")   # parser; a CPU host has none
        from vllm.entrypoints.common.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser
        p = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
        return p, "vllm.entrypoints.common.cli_args.make_arg_parser", _version("vllm")
    raise SystemExit(f"unknown engine {engine!r}")


def _jsonable(x: Any) -> Any:
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, (list, tuple, set, frozenset)):
        items = [_jsonable(v) for v in x]
        return sorted(items, key=str) if isinstance(x, (set, frozenset)) else items
    return str(x)


def dump(p: argparse.ArgumentParser) -> dict[str, Any]:
    """Every option string of the parser with how many values it takes and its choices."""
    opts: dict[str, Any] = {}
    positionals = []
    for a in p._actions:
        if isinstance(a, argparse._HelpAction):
            continue
        takes = a.nargs != 0 and not isinstance(a, (
            argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._StoreConstAction,
            argparse._CountAction, argparse._AppendConstAction))
        rec = {"names": list(a.option_strings), "dest": a.dest, "nargs": _jsonable(a.nargs),
               "takes_value": takes,
               "choices": _jsonable(list(a.choices)) if a.choices is not None else None,
               "deprecated": "deprecat" in (a.help or "").lower()
               or "Deprecated" in type(a).__name__}
        if not a.option_strings:
            positionals.append(rec)
        for s in a.option_strings:
            if s.startswith("--"):
                opts[s] = rec
    return {"allow_abbrev": p.allow_abbrev, "options": dict(sorted(opts.items())),
            "positionals": positionals}


def check(p: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """The parser's own error for `argv` (None: accepted)."""
    def error(message: str) -> None:
        raise _ParseError(message)
    p.error = error  # type: ignore[method-assign]
    for sub in p._actions:                    # subparsers report through their own parser
        if isinstance(sub, argparse._SubParsersAction):
            for sp in sub.choices.values():
                sp.error = error  # type: ignore[method-assign]
    try:
        p.parse_args(argv)
    except _ParseError as exc:
        return str(exc)
    except SystemExit as exc:                 # a parser that exits without error()
        return f"the parser exited with status {exc.code}"
    return None


def main(args: list[str]) -> int:
    # run as a script, this folder is sys.path[0]: its sglang.py / vllm.py (servelab's
    # adapters) would shadow the engines' packages
    if "__file__" in globals():               # not when run with -c (the source passed in)
        here = os.path.dirname(os.path.abspath(__file__))
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    if len(args) < 3 or args[0] not in ("check", "dump"):
        print(__doc__, file=sys.stderr)
        return 2
    verb, engine, role = args[:3]
    try:
        p, source, version = build(engine, role)
    except Exception as exc:  # noqa: BLE001 - not importable here: the caller falls back
        print(json.dumps({"unavailable": f"{type(exc).__name__}: {exc}"[:500]}))
        return 3
    head = {"engine": engine, "role": role, "version": version, "parser": source}
    if verb == "dump":
        print(json.dumps({**head, **dump(p)}))
        return 0
    argv = args[4:] if len(args) > 3 and args[3] == "--" else args[3:]
    err = check(p, argv)
    print(json.dumps({**head, "ok": err is None, "error": err}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
