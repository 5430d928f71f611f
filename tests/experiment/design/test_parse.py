"""Experiment files (experiment/design/parse.py, plan/preflight.py): one-line errors naming the
key, pre-flight checks before any launch, recipes per engine, the examples and the documented
example valid."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from experiment_files import BASE, error_of, load_text

from servelab.errors import UserError
from servelab.experiment.plan import processes


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (
            "repetitions = 0\n" + BASE.format(engine="sglang", model="m", arm_b=""),
            "e.toml: repetitions: Input should be greater than or equal to 1",
        ),
        (
            BASE.format(engine="sglang", model="m", arm_b="") + "repetitions = 3\n",
            "load.repetitions: unknown key",
        ),
        (
            BASE.format(engine="sglang", model="m", arm_b="flags = { tp-size = 2 }\ncolour = 1"),
            "arms.b.colour: unknown key",
        ),
        (BASE.format(engine="tgi", model="m", arm_b=""), "engine: unknown engine 'tgi'"),
        (
            BASE.format(engine="sglang", model="m", arm_b="").replace(
                "concurrency = [1, 8]", "concurrency = [0]"
            ),
            "load.concurrency: concurrency values must be between 1 and",
        ),
        (
            BASE.format(engine="sglang", model="m", arm_b="").replace("[arms.b]\n", ""),
            "arms: an experiment needs at least two arms",
        ),
        ('name = "x"\nengine = "sglang"\n[load\n', "invalid TOML"),
        (
            BASE.format(engine="sglang", model="m", arm_b="").replace('"x"', '"my exp"'),
            "e.toml: name: 'my exp' must be letters, digits, '-', '_' or '.'",
        ),
        (  # a table where a flag value belongs: one problem at the flag, not one per union type
            BASE.format(engine="sglang", model="m", arm_b="flags = { tp-size = [1, { a = 1 }] }"),
            "arms.b.flags.tp-size: must be a string, a number, true/false, or a list",
        ),
        (  # a delta for a process the deployment does not have would silently change nothing
            BASE.format(engine="sglang", model="m", arm_b='roles = ["decode"]\nflags = { ep = 2 }'),
            "arms.b.roles: no 'decode' process in this deployment (its processes: server)",
        ),
        (
            BASE.format(engine="sglang", model="m", arm_b="")
            + '[workload]\ndataset = "no/such.json"\n',
            "workload: --dataset no/such.json: no such file",
        ),
    ],
)
def test_bad_file_gives_one_line_naming_the_key(tmp_path, text, want):
    assert want in error_of(tmp_path, text)


def test_cli_prints_one_line_and_exits_2(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text(
        BASE.format(
            engine="sglang", model="m", arm_b="flags = { tp-size = 'two' }\nremove = ['dp-size']"
        )
    )
    p = subprocess.run(
        [sys.executable, "-m", "servelab", "run", str(f)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "arms.b.remove" in lines[0], (
        p.stderr
    )


def test_the_documented_full_example_is_valid(tmp_path):
    doc = (Path(__file__).resolve().parents[3] / "docs" / "EXPERIMENTS.md").read_text()
    block = doc.split("```toml\n", 1)[1].split("```", 1)[0]
    text = "\n".join(
        line for line in block.splitlines() if not line.startswith(("dataset =", "tokenizer ="))
    )
    # the page lists [adaptive] beside a fixed count; a file sets one or the other
    text = text.replace("repetitions = 5 ", 'repetitions = "auto" ', 1)
    s = load_text(tmp_path, text)
    (proc,) = processes.resolve(s, "mtp")
    assert proc.flags["speculative-num-draft-tokens"] == 2 and "cuda-graph-max-bs" not in proc.flags
    assert proc.flags["mem-fraction-static"] == 0.8 and proc.env["NCCL_PROTO"] == "LL"


# --- hostile files (issue: bad input that crashed or hung) ----------------------------------

EXTERNAL = 'name = "x"\nengine = "external"\nurl = "http://127.0.0.1:1"\n[arms.a]\n[arms.b]\n'


def test_what_is_not_a_regular_file_of_modest_size_is_refused_at_once(tmp_path):
    import os

    from servelab.experiment.design.parse import MAX_FILE_BYTES, read
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)                      # reading it would block forever
    big = tmp_path / "big.toml"
    big.write_bytes(b"# " + b"x" * MAX_FILE_BYTES)
    for path, words in [("/dev/zero", "not a regular file"), (str(fifo), "not a regular file"),
                        (str(tmp_path), "not a regular file"), (str(big), "at most")]:
        with pytest.raises(UserError, match=words) as err:
            read(path)
        assert "\n" not in str(err.value)


@pytest.mark.parametrize(("text", "words"), [
    (EXTERNAL + "[load]\nconcurrency = [1180591620717411303424]\n", "load.concurrency.0: a number beyond"),
    (EXTERNAL + "[base.flags]\ntp = -1180591620717411303424\n[load]\nconcurrency = [1]\n",
     "base.flags.tp: a number beyond"),
    (EXTERNAL + "[load]\nconcurrency = [2000000]\n", "between 1 and 1,000,000"),
    (EXTERNAL + "[load]\nrequest_rate = [nan]\n", "request rates must be numbers > 0"),
    ("repetitions = 3\n" + EXTERNAL + "[adaptive]\nmax = 5\n[load]\nconcurrency = [1]\n",
     '[adaptive] is read only with repetitions = "auto"'),
    ("x = " + "[" * 100_000 + "]" * 100_000 + "\n", "nested too deeply"),
])
def test_numbers_and_tables_that_would_fail_late_are_one_line_errors(tmp_path, text, words):
    assert words in error_of(tmp_path, text)
