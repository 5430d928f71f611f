"""An experiment stored by an earlier release resumes: keys added to the design since then
are left out of its hash while at their defaults (design/load.py ADDED_SINCE_FIRST_HASH). The
fixture was written by the release itself (commit 04aadbd): its spec and hash of
examples/demo.toml, which has not changed since."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from servelab.errors import UserError
from servelab.experiment.design.parse import parse
from servelab.store import Store

ROOT = Path(__file__).resolve().parents[3]
OLD = json.loads((Path(__file__).parent / "fixtures" / "demo_04aadbd.json").read_text())


def _demo(**workload):
    d = tomllib.loads((ROOT / "examples" / "demo.toml").read_text())
    d["workload"].update(workload)
    return parse(d)


def test_the_demo_stored_by_the_earlier_release_resumes(tmp_path):
    spec = _demo()
    assert spec.design_hash() == OLD["design_hash"]
    with Store(tmp_path / "r.db") as store:
        assert store.ensure_experiment("demo", OLD["spec"], OLD["design_hash"]) is False
        assert store.ensure_experiment("demo", spec.to_json(), spec.design_hash()) is True


@pytest.mark.parametrize("key,value", [("scrape_interval_s", 0.25), ("warmup_until_steady", True),
                                       ("trace_speed", 2.0)])
def test_a_new_key_away_from_its_default_is_a_different_design(tmp_path, key, value):
    extra = {"warmup": 0} if key == "warmup_until_steady" else {}
    spec = _demo(**{key: value}, **extra)
    assert spec.design_hash() != OLD["design_hash"]
    with Store(tmp_path / "r.db") as store:
        store.ensure_experiment("demo", OLD["spec"], OLD["design_hash"])
        with pytest.raises(UserError, match="different design"):
            store.ensure_experiment("demo", spec.to_json(), spec.design_hash())
