"""Trace prompts from hash_ids: requests sharing leading hash_id blocks send identical token
prefixes, checked through the server's /tokenize (token ids, not only counts) and with a
byte-level BPE trained here; lengths exact; the server's cached tokens recorded per request."""

from __future__ import annotations

import asyncio
import json
import random
import urllib.request
from dataclasses import replace

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from servelab.bench.config import BenchConfig, LoadPoint, WorkloadConfig
from servelab.bench.datasets import build_workload
from servelab.bench.datasets.text import VOCAB
from servelab.bench.run import prompt_seed, run_load_point
from servelab.bench.scripted.harness import serve_in_thread
from servelab.bench.scripted.script import Script

ROWS = [  # (input_length, hash_ids): blocks of 16 (the last one partial), as Mooncake's are;
    # rows 0, 2, 3 and 5 share blocks [0, 1]; row 5 repeats row 0 (its partial block too)
    (40, [0, 1, 2]), (20, [7, 8]), (36, [0, 1, 3]), (45, [0, 1, 5]), (16, [9]), (40, [0, 1, 2])]


def trace(tmp_path) -> str:
    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps({"timestamp": 10 * i, "input_length": n, "output_length": 2,
                                     "hash_ids": h}) + "\n" for i, (n, h) in enumerate(ROWS)))
    return str(p)


def tokenize(url: str, text: str) -> list[int]:
    req = urllib.request.Request(url + "/tokenize", data=json.dumps({"prompt": text}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as f:
        return json.loads(f.read())["tokens"]


def shared_blocks(a: list[int], b: list[int]) -> int:
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k


def check_prefixes(ids: list[list[int]]) -> None:
    """Requests sharing k leading hash ids share exactly their first k blocks of tokens, and
    the token right after differs (a new block is new text)."""
    for i, (ni, hi) in enumerate(ROWS):
        for j, (nj, hj) in enumerate(ROWS[i + 1:], i + 1):
            k = shared_blocks(hi, hj)
            n = min(16 * k, ni, nj)
            assert ids[i][:n] == ids[j][:n], (i, j, k)
            if n < min(ni, nj):
                assert ids[i][n:n + 4] != ids[j][n:n + 4], (i, j, k)


def test_shared_hash_ids_send_identical_token_prefixes_through_tokenize(tmp_path):
    with serve_in_thread(Script(ttft_ms=1, gap_ms=0.5, cache_block=16)) as h:
        cfg = BenchConfig(base_url=h.url, workload=WorkloadConfig(
            dataset_name="trace", dataset=trace(tmp_path), trace_block_size=16))
        res = run_load_point(cfg, LoadPoint(), progress=False)
        wl_prompts = [s["prompt_tokens"] for s in h.log()]

        async def remote(text: str) -> int:  # the server's /tokenize, as bench counts
            return len(tokenize(h.url, text))

        # the prompts the load point sent (its seed builds the same ones), and their token ids
        # as the server reads them
        sent = replace(cfg.workload, seed=prompt_seed(cfg.workload.seed, "replay"))
        wl = asyncio.run(build_workload(sent, 0, remote))
        ids = [tokenize(h.url, r.prompt) for r in wl.requests]
    assert wl_prompts == [n for n, _ in ROWS]  # the server counted the trace's lengths
    assert [len(x) for x in ids] == wl_prompts
    assert res.summary["input_len_exact"] is True
    check_prefixes(ids)
    assert ids[5] == ids[0]  # a repeated request is the same prompt
    # the server's prefix cache (16-token blocks) reused what the trace shares, per request
    cached = {r["index"]: r["cached_tokens"] for r in res.records}
    assert cached == {0: None, 1: None, 2: 32, 3: 32, 4: None, 5: 32}  # vLLM-style: 0 left out
    assert res.summary["cached_token_share"] == 96 / sum(n for n, _ in ROWS)
    assert res.summary["cached_tokens_reported"] == 3
    # the workload's own bound: row 5 could reuse all 40 (its partial block too)
    assert [r["prefix_len"] for r in sorted(res.records, key=lambda r: r["index"])] == \
        [0, 0, 32, 32, 0, 40]
    assert res.summary["prefix_share"] == 104 / sum(n for n, _ in ROWS)


def test_block_prefixes_hold_with_a_byte_level_bpe(tmp_path):
    rng = random.Random(1)
    corpus = [" ".join(rng.choice(VOCAB[:60]) for _ in range(30)) for _ in range(200)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=300, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tp = tmp_path / "tokenizer.json"
    tok.save(str(tp))
    cfg = WorkloadConfig(dataset_name="trace", dataset=trace(tmp_path), trace_block_size=16,
                         tokenizer=str(tp))
    wl = asyncio.run(build_workload(cfg, warmup=0, remote_count=None))
    ids = [tok.encode(r.prompt).ids for r in wl.requests]
    assert [len(x) for x in ids] == [n for n, _ in ROWS] and wl.input_len_exact
    check_prefixes(ids)


def test_block_prefixes_hold_with_the_embedded_engines_tokenizer(tmp_path):
    """The embedded engine's /tokenize is its byte-level tokenizer (a token per UTF-8 byte, plus
    BOS): blocks of 16 bytes, the first one leaving room for BOS; exact lengths, same prefixes."""
    from servelab.mini.model import tokenizer as tk

    async def remote(text: str) -> int:  # what the embedded server's /tokenize answers
        return len(tk.encode(text))

    cfg = WorkloadConfig(dataset_name="trace", dataset=trace(tmp_path), trace_block_size=16)
    wl = asyncio.run(build_workload(cfg, warmup=0, remote_count=remote))
    ids = [tk.encode(r.prompt) for r in wl.requests]
    assert [len(x) for x in ids] == [n for n, _ in ROWS] and wl.input_len_exact
    check_prefixes(ids)
