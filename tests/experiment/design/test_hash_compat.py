"""An experiment stored by an earlier release resumes: keys added to the design since are left
out of its hash while at their defaults (design/load.py ADDED_KEYS), and the hash each later
release gave a design is accepted too. The fixtures were written by the releases themselves:
an example file as it was at that commit (`toml`), and the spec and hash that release stored
for it."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import pytest

from servelab.errors import UserError
from servelab.experiment.design.parse import parse
from servelab.store import Store

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = Path(__file__).parent / "fixtures"


def _fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def _spec(old: dict, **workload):
    d = tomllib.loads(old["toml"])
    d["workload"].update(workload)
    return parse(d)


@pytest.fixture(autouse=True)
def _in_root():  # the example files name their traces relative to the repository
    cwd = os.getcwd()
    os.chdir(ROOT)
    yield
    os.chdir(cwd)


@pytest.mark.parametrize("name", ["demo_04aadbd.json", "prefix_cache_trace_86dc756.json"])
def test_an_experiment_stored_by_an_earlier_release_resumes(tmp_path, name):
    old = _fixture(name)
    spec = _spec(old)
    assert old["design_hash"] in (spec.design_hash(), *spec.legacy_design_hashes())
    with Store(tmp_path / "r.db") as store:
        assert store.ensure_experiment("x", old["spec"], old["design_hash"]) is False
        assert store.ensure_experiment("x", spec.to_json(), spec.design_hash(),
                                       spec.legacy_design_hashes()) is True
        # the stored hash is now the canonical one: the next resume matches it directly
        assert store.ensure_experiment("x", spec.to_json(), spec.design_hash()) is True


def test_the_first_releases_hash_is_the_canonical_one():
    old = _fixture("demo_04aadbd.json")
    assert _spec(old).design_hash() == old["design_hash"]


@pytest.mark.parametrize("key,value", [("scrape_interval_s", 0.25), ("warmup_until_steady", True),
                                       ("trace_speed", 2.0)])
def test_a_new_key_away_from_its_default_is_a_different_design(tmp_path, key, value):
    old = _fixture("demo_04aadbd.json")
    extra = {"warmup": 0} if key == "warmup_until_steady" else {}
    spec = _spec(old, **{key: value}, **extra)
    assert old["design_hash"] not in (spec.design_hash(), *spec.legacy_design_hashes())
    with Store(tmp_path / "r.db") as store:
        store.ensure_experiment("demo", old["spec"], old["design_hash"])
        with pytest.raises(UserError, match="different design"):
            store.ensure_experiment("demo", spec.to_json(), spec.design_hash(),
                                    spec.legacy_design_hashes())
