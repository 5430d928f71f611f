"""Workload: exact input lengths via the server's /tokenize, a local HF tokenizer trained in the
test, or approximate (flagged); ShareGPT files; reproducible with a seed."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from servelab.bench.config import BenchConfig, LoadPoint, WorkloadConfig
from servelab.bench.datasets import build_workload
from servelab.bench.datasets.text import VOCAB, fit_prompt, local_counter
from servelab.bench.run import run_load_point
from servelab.bench.scripted.harness import serve_in_thread
from servelab.bench.scripted.script import Script
from servelab.errors import UserError


@pytest.fixture
def bpe_path(tmp_path):
    """A small byte-level BPE trained here: common words become 1-3 tokens, so fitting a prompt
    to an exact count needs the search, not a word count."""
    rng = random.Random(1)
    corpus = [" ".join(rng.choice(VOCAB[:60]) for _ in range(30)) for _ in range(200)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    p = tmp_path / "tokenizer.json"
    tok.save(str(p))
    return p


def test_server_tokenize_gives_exact_lengths():
    with serve_in_thread(Script(ttft_ms=1, gap_ms=0.5)) as h:
        cfg = BenchConfig(base_url=h.url, workload=WorkloadConfig(input_len=37, output_len=3,
                                                                  num_prompts=6))
        res = run_load_point(cfg, LoadPoint(concurrency=3), progress=False)
        log = h.log()
    s = res.summary
    assert s["input_len_exact"] is True and s["input_len_source"] == "server:/tokenize"
    assert [r["prompt_tokens"] for r in log] == [37] * 6  # the server's own count of each prompt
    assert all(r["input_tokens"] == 37 and r["input_tokens_source"] == "usage" for r in res.records)
    assert [r["max_tokens"] for r in log] == [3] * 6


def test_local_tokenizer_fallback_is_exact(bpe_path):
    ref = Tokenizer.from_file(str(bpe_path))
    cfg = WorkloadConfig(input_len=50, output_len=4, num_prompts=8, seed=2, tokenizer=str(bpe_path))
    wl = asyncio.run(build_workload(cfg, warmup=0, remote_count=None))
    assert wl.input_len_source == f"tokenizer:{bpe_path}" and wl.input_len_exact
    for r in wl.requests:
        assert len(ref.encode(r.prompt).ids) == 50
    # words are not single tokens in this vocabulary: the search did real work
    assert any(len(r.prompt.split()) != 50 for r in wl.requests)
    # through a whole run against a server without /tokenize
    with serve_in_thread(Script(ttft_ms=1, gap_ms=0.5, tokenize=False)) as h:
        res = run_load_point(BenchConfig(base_url=h.url, workload=cfg), LoadPoint(concurrency=2),
                             progress=False)
    assert res.summary["input_len_exact"] is True
    assert res.summary["input_len_source"].startswith("tokenizer:")


def test_without_any_tokenizer_lengths_are_flagged_approximate():
    with serve_in_thread(Script(ttft_ms=1, gap_ms=0.5, tokenize=False)) as h:
        cfg = BenchConfig(base_url=h.url, workload=WorkloadConfig(input_len=20, output_len=3,
                                                                  num_prompts=3))
        res = run_load_point(cfg, LoadPoint(concurrency=1), progress=False)
    assert res.summary["input_len_exact"] is False
    assert res.summary["input_len_source"] == "approximate"


def test_fit_prompt_hits_target_with_word_level_granularity_gaps():
    """A counter where every word is 2 tokens: odd targets need a filler; fillers are 1 token."""

    async def count(text: str) -> int:
        return sum(1 if len(w) == 1 else 2 for w in text.split())

    for target in (1, 2, 7, 33, 100):
        prompt, n, exact = asyncio.run(fit_prompt(count, target, random.Random(target)))
        assert exact and n == target and asyncio.run(count(prompt)) == target


def test_fit_prompt_is_exact_with_a_byte_level_tokenizer():
    """Byte-level counting (the embedded engine's /tokenize): every word plus its space is >= 2
    tokens, so the top-up must glue single characters on."""

    async def count(text: str) -> int:
        return len(text.encode())

    for target in (1, 2, 7, 33, 256):
        prompt, n, exact = asyncio.run(fit_prompt(count, target, random.Random(target)))
        assert exact and n == target and len(prompt.encode()) == target


def test_same_seed_same_prompts_and_warmup_does_not_shift_them():
    async def count(text: str) -> int:
        return len(text.split())

    a = asyncio.run(build_workload(WorkloadConfig(input_len=9, num_prompts=5, seed=4), 0, count))
    b = asyncio.run(build_workload(WorkloadConfig(input_len=9, num_prompts=5, seed=4), 3, count))
    c = asyncio.run(build_workload(WorkloadConfig(input_len=9, num_prompts=5, seed=5), 0, count))
    assert [r.prompt for r in a.requests] == [r.prompt for r in b.requests]
    assert len(b.warmup) == 3 and {r.prompt for r in b.warmup}.isdisjoint(r.prompt for r in a.requests)
    assert [r.prompt for r in a.requests] != [r.prompt for r in c.requests]
    assert len({r.prompt for r in a.requests}) == 5


def test_sharegpt_dataset(tmp_path):
    convs = [{"id": str(i), "conversations": [
        {"from": "human", "value": " ".join(["ask"] * (3 + i))},
        {"from": "gpt", "value": " ".join(["answer"] * (2 + 2 * i))},
    ]} for i in range(5)]
    convs.append({"id": "bad", "conversations": [{"from": "human", "value": "alone"}]})
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(convs))
    with serve_in_thread(Script(ttft_ms=1, gap_ms=0.5)) as h:
        cfg = BenchConfig(base_url=h.url, workload=WorkloadConfig(num_prompts=4, dataset=str(path)))
        res = run_load_point(cfg, LoadPoint(concurrency=2), progress=False)
        log = h.log()
    # each request carries one conversation's prompt and asks for its reply's length
    pairs = {(3 + i, 2 + 2 * i) for i in range(5)}
    got = {(r["prompt_tokens"], r["max_tokens"]) for r in log}
    assert len(got) == 4 and got <= pairs
    assert res.summary["completed"] == 4 and res.summary["input_len"] is None


def test_warm_up_prompts_never_repeat_a_measured_sharegpt_prompt(tmp_path):
    # 30 conversations, 30 measured prompts and 30 warm-up ones (a steady point's pool): the
    # file cycles, so its prompts would come back in the warm-up, and a prefix cache would
    # serve the measured ones from it; random prompts of the measured lengths go instead
    def write(n: int) -> str:
        convs = [{"conversations": [{"from": "human", "value": f"q{i} " + "ask " * (3 + i % 7)},
                                    {"from": "gpt", "value": "answer " * (2 + i % 5)}]}
                 for i in range(n)]
        path = tmp_path / f"sg{n}.json"
        path.write_text(json.dumps(convs))
        return str(path)

    async def count(text: str) -> int:
        return len(text.split())

    for counter in (None, count):
        wl = asyncio.run(build_workload(WorkloadConfig(num_prompts=30, dataset=write(30)), 30,
                                        counter))
        measured = {r.prompt for r in wl.requests}
        assert len(wl.warmup) == 30 and measured.isdisjoint(r.prompt for r in wl.warmup)
        lengths = {(r.input_len, r.output_len) for r in wl.requests}
        assert {(r.input_len, r.output_len) for r in wl.warmup} <= lengths
        assert [r.index for r in wl.warmup] == list(range(30, 60))
    # a file long enough: the warm-up is the file's other conversations, as before
    path = write(61)
    wl = asyncio.run(build_workload(WorkloadConfig(num_prompts=30, dataset=path), 30, None))
    texts = {c["conversations"][0]["value"] for c in json.loads(open(path).read())}
    measured = {r.prompt for r in wl.requests}
    assert {r.prompt for r in wl.warmup} <= texts - measured


def test_bad_dataset_and_tokenizer_are_user_errors(tmp_path):
    p = tmp_path / "x.json"
    p.write_text(json.dumps([{"conversations": []}]))
    with pytest.raises(UserError, match="no conversation"):
        asyncio.run(build_workload(WorkloadConfig(dataset=str(p)), 0, None))
    bad = tmp_path / "tok.json"
    bad.write_text("{}")
    with pytest.raises(UserError, match="--tokenizer"):
        local_counter(str(bad))


def test_each_load_point_gets_its_own_prompts_and_arms_share_them():
    """A prefix cache must not turn a later load point's TTFT into a cache hit: load points
    measured on one server draw different prompts; the same load point (another arm or
    repetition) gets the same prompts again."""
    from servelab.bench import run as bench_run

    bench_run._WORKLOADS.clear()
    with serve_in_thread(Script(ttft_ms=1, gap_ms=0.2)) as h:
        cfg = BenchConfig(base_url=h.url, workload=WorkloadConfig(input_len=12, output_len=2,
                                                                  num_prompts=5, seed=3))
        for c in (1, 2):
            run_load_point(cfg, LoadPoint(concurrency=c), progress=False)
        built = {k[1].seed: [r.prompt for r in wl.requests] for k, wl in bench_run._WORKLOADS.items()}
        bench_run._WORKLOADS.clear()
        run_load_point(cfg, LoadPoint(concurrency=1), progress=False)  # rebuilt from scratch
        again = [[r.prompt for r in wl.requests] for wl in bench_run._WORKLOADS.values()][0]
    s1, s2 = bench_run.prompt_seed(3, "c=1"), bench_run.prompt_seed(3, "c=2")
    assert set(built) == {s1, s2}
    assert set(built[s1]).isdisjoint(built[s2])
    assert again == built[s1]


def _words(text: str) -> int:
    return len(text.split())


def test_shared_prefix_groups_warm_up_with_groups_of_their_own():
    """The warm-up is shaped as the measured load (so a steady warm-up reaches its state): the
    same group sizes and lengths, its own system prompts, none of the measured text."""
    async def count(text: str) -> int:
        return _words(text)

    cfg = WorkloadConfig(dataset_name="generated-shared-prefix", gsp_num_groups=2,
                         gsp_prompts_per_group=3, gsp_system_prompt_len=40, gsp_question_len=6,
                         gsp_output_len=5, num_prompts=6, seed=3)
    wl = asyncio.run(build_workload(cfg, 8, count))
    assert len(wl.requests) == 6 and len(wl.warmup) == 8  # 8 > 2 x 3: a second set
    assert {(r.input_len, r.output_len) for r in wl.warmup} == \
        {(r.input_len, r.output_len) for r in wl.requests} == {(46, 5)}
    assert [r.index for r in wl.warmup] == list(range(6, 14))

    def system(r) -> str:
        return " ".join(r.prompt.split()[:40])

    measured = {system(r) for r in wl.requests}
    warm = [system(r) for r in wl.warmup]
    assert len(measured) == 2 and measured.isdisjoint(warm)
    assert len(set(warm[:6])) == 2  # the first warm-up set: 2 groups of 3 sharing a prompt
    assert {r.prompt for r in wl.requests}.isdisjoint(r.prompt for r in wl.warmup)


def test_a_traces_warm_up_has_the_measured_lengths():
    wl = asyncio.run(build_workload(WorkloadConfig(
        dataset_name="trace", num_prompts=12,
        dataset=str(Path(__file__).resolve().parents[2] / "examples/traces/mooncake_sample.jsonl"),
        input_len=256, output_len=256), 10, None))
    lengths = {(r.input_len, r.output_len) for r in wl.requests}
    assert len(wl.warmup) == 10 and {(r.input_len, r.output_len) for r in wl.warmup} <= lengths
    assert (256, 256) not in lengths  # not --input-len / --output-len, as before
    assert {r.prompt for r in wl.requests}.isdisjoint(r.prompt for r in wl.warmup)
