"""Generated shared-prefix groups: G x P requests of exactly S + Q tokens, a group's prompts share
their first S tokens (token ids through /tokenize), and a prefix cache finds exactly them."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections import Counter
from dataclasses import replace

import pytest

from servelab.bench.config import BenchConfig, LoadPoint, WorkloadConfig
from servelab.bench.datasets import build_workload
from servelab.bench.run import prompt_seed, run_load_point
from servelab.bench.scripted.harness import serve_in_thread
from servelab.bench.scripted.script import Script
from servelab.errors import UserError

G, P, S, Q = 3, 4, 20, 5


def tokenize(url: str, text: str) -> list[int]:
    req = urllib.request.Request(url + "/tokenize", data=json.dumps({"prompt": text}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as f:
        return json.loads(f.read())["tokens"]


def test_groups_share_exactly_their_system_prompt():
    wcfg = WorkloadConfig(dataset_name="generated-shared-prefix", gsp_num_groups=G,
                          gsp_prompts_per_group=P, gsp_system_prompt_len=S, gsp_question_len=Q,
                          gsp_output_len=3, num_prompts=1)  # --num-prompts does not apply
    with serve_in_thread(Script(ttft_ms=1, gap_ms=0.5, cache_block=4)) as h:
        res = run_load_point(BenchConfig(base_url=h.url, workload=wcfg),
                             LoadPoint(concurrency=1), progress=False)
        log = h.log()

        async def remote(text: str) -> int:
            return len(tokenize(h.url, text))

        sent = replace(wcfg, seed=prompt_seed(0, "c=1"))
        wl = asyncio.run(build_workload(sent, 0, remote))
        ids = [tokenize(h.url, r.prompt) for r in wl.requests]
    assert [r["prompt_tokens"] for r in log] == [S + Q] * G * P and wl.input_len_exact
    assert [r["max_tokens"] for r in log] == [3] * G * P
    groups = [r.prefix_group for r in wl.requests]
    assert Counter(groups) == {k: P for k in range(G)}
    assert groups != sorted(groups)  # shuffled, as SGLang does
    for a, ra in zip(ids, wl.requests, strict=True):
        for b, rb in zip(ids, wl.requests, strict=True):
            same = ra.prefix_group == rb.prefix_group
            assert (a[:S] == b[:S]) is same
            if ra.index != rb.index:
                assert a[S:] != b[S:]  # every question is its own
    # closed loop, one at a time: every request after its group's first finds the system prompt
    s = res.summary
    assert sorted(r["cached_tokens"] or 0 for r in res.records) == [0] * G + [S] * G * (P - 1)
    assert s["cached_token_share"] == pytest.approx(s["prefix_share"]) == (
        G * (P - 1) * S / (G * P * (S + Q)))


def test_dataset_names_are_checked():
    with pytest.raises(UserError, match="needs --dataset-path"):
        WorkloadConfig(dataset_name="trace")
    with pytest.raises(UserError, match="takes no --dataset-path"):
        WorkloadConfig(dataset_name="generated-shared-prefix", dataset=__file__)
    with pytest.raises(UserError, match="--gsp-question-len must be >= 1"):
        WorkloadConfig(dataset_name="generated-shared-prefix", gsp_question_len=0)
    with pytest.raises(UserError, match="not one of"):
        WorkloadConfig(dataset_name="mooncake", dataset=__file__)
