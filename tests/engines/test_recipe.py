"""Recipes are data with constraints: named flag sets per engine, env, and the model rules."""

from __future__ import annotations

import pytest

from servelab.engines import recipe
from servelab.errors import UserError


def test_recipes_are_data_with_constraints():
    names = set(recipe.all_recipes())
    assert {
        "mtp-conservative",
        "mtp-engine-test",
        "nccl-ll",
        "cuda-graph-off",
        "cuda-graph-on",
    } <= names
    test = recipe.get("mtp-engine-test").flags_for("sglang")
    assert (
        test["speculative-num-steps"],
        test["speculative-eagle-topk"],
        test["speculative-num-draft-tokens"],
    ) == (3, 1, 4)
    assert recipe.get("nccl-ll").env == {"NCCL_PROTO": "LL"}
    ok = {"speculative-algorithm": "EAGLE", "speculative-eagle-topk": 1}
    assert recipe.constraint_problems("deepseek-ai/DeepSeek-V4-Flash", ok) == []
    assert recipe.constraint_problems("deepseek-ai/DeepSeek-V4-Flash", {}) == []  # no MTP: n/a
    assert (
        recipe.constraint_problems("meta-llama/Llama-3", {**ok, "speculative-eagle-topk": 4}) == []
    )
    bad = recipe.constraint_problems("DeepSeek-V4-Pro", {**ok, "speculative-algorithm": "NGRAM"})
    assert len(bad) == 1 and "speculative-algorithm='NGRAM'" in bad[0]
    with pytest.raises(UserError, match="no settings for engine 'vllm'"):
        recipe.Recipe("r", "", "", {"sglang": {}}, {}, ("sglang",)).flags_for("vllm")
