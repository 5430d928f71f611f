"""Property: generated experiment files given to `servelab run FILE --check` end in exit 0, 1
or 2 with at most a one-line error, never a traceback or an "internal error". The files are the
shipped demo with fields replaced by generated TOML values (wrong types, negative and huge
numbers, markup and escapes in strings, unknown keys), or arbitrary bytes. In-process through
the CLI's entry point (its error policy is what is checked), so many files fit the budget.

Repetitions are kept to 0-9 here: their upper bound (a huge count hung `--check`) belongs to the
spec's own validation and its tests."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

DEMO = tomllib.loads((Path(__file__).parents[2] / "examples" / "demo.toml").read_text())

scalars = st.one_of(
    st.integers(-(2**63), 2**63), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
    st.text(max_size=12), st.sampled_from(["[/x]", "\x1b[2J", "speed", "", "a" * 300]))
values = st.one_of(scalars, st.lists(scalars, max_size=3),
                   st.dictionaries(st.text(min_size=1, max_size=6), scalars, max_size=2))
TOP = ["name", "hypothesis", "engine", "model", "baseline", "order", "restart", "noise_band",
       "primary_metric", "retries", "nonsense"]
SECTIONS = {"load": ["concurrency", "request_rate"],
            "workload": ["input_len", "output_len", "num_prompts", "warmup", "seed"],
            "timeouts": ["ready_s", "teardown_s"], "base.flags": ["max-running-requests"]}


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return {"nan": "nan", "inf": "inf", "-inf": "-inf"}.get(repr(v), repr(v))
    if isinstance(v, str):
        return '"' + "".join(c if c.isprintable() and c not in '"\\' else f"\\u{ord(c):04x}"
                             for c in v) + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return "{" + ", ".join(f'"{k}" = {_toml_value(x)}' for k, x in v.items()) + "}"


def _render(doc: dict) -> str:
    lines, tables = [], []
    for k, v in doc.items():
        if isinstance(v, dict) and k in ("base", "arms", "load", "workload", "timeouts"):
            tables.append((k, v))
        else:
            lines.append(f'"{k}" = {_toml_value(v)}')
    for name, t in tables:
        flat = {kk: vv for kk, vv in t.items() if not isinstance(vv, dict)}
        lines.append(f"[{name}]")
        lines += [f'"{kk}" = {_toml_value(vv)}' for kk, vv in flat.items()]
        for kk, vv in t.items():
            if isinstance(vv, dict):
                lines.append(f"[{name}.{kk}]")
                lines += [f'"{a}" = {_toml_value(b)}' for a, b in vv.items()]
    return "\n".join(lines) + "\n"


def _run(monkeypatch, capsys, path: Path) -> tuple[int, str]:
    from servelab.cli import main

    monkeypatch.setattr(sys, "argv", ["servelab", "run", str(path), "--check"])
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code or 0
    out, err = capsys.readouterr()
    return code, err


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(top=st.dictionaries(st.sampled_from(TOP), values, max_size=3),
       sect=st.dictionaries(st.sampled_from(sorted(SECTIONS)), values, max_size=2),
       reps=st.integers(0, 9), raw=st.one_of(st.none(), st.binary(max_size=64)))
def test_generated_spec_files_never_traceback(tmp_path, monkeypatch, capsys, top, sect, reps,
                                              raw):
    monkeypatch.setenv("SERVELAB_HOME", str(tmp_path / "home"))
    f = tmp_path / "spec.toml"
    if raw is not None:
        f.write_bytes(raw)
    else:
        doc = {k: (dict(v) if isinstance(v, dict) else v) for k, v in DEMO.items()}
        doc = {**doc, "repetitions": reps, **top}
        for name, v in sect.items():
            head, _, sub = name.partition(".")
            table = dict(doc.get(head) or {}) if isinstance(doc.get(head), dict) else {}
            if sub:
                inner = dict(table.get(sub) or {})
                inner[SECTIONS[name][0]] = v
                table[sub] = inner
            else:
                table[SECTIONS[name][0]] = v
            doc[head] = table
        f.write_text(_render(doc))
    code, err = _run(monkeypatch, capsys, f)
    assert code in (0, 1, 2), (code, err[-600:])
    assert "Traceback" not in err and "internal error" not in err, err[-1500:]
    if code:
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), err[-1500:]
