"""Benchmark the embedded engine in-process (no HTTP): closed-loop load at several concurrencies,
for engine variants (speculative decoding on/off, CUDA graphs on/off, attention backends).

    PYTHONPATH=src python benchmarks/bench_mini.py --config flash --device cuda \
        --concurrency 1,8,16,64 --variants base,mtp,graph,graph+mtp --out flash.jsonl

Per load point: output tok/s (all requests' tokens / wall time from first submit to last finish),
median TPOT = (e2e - ttft) / (tokens - 1) and TTFT per request (ms), and the acceptance length
tau = 1 + accepted / drafts from the engine's counters over the window. Time stamps are taken in
the engine's own thread (the callback), so this measures the engine, not an HTTP stack; use
`servelab bench` against `servelab serve` for the served numbers.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
import traceback

import torch

from servelab.mini.engine.args import EngineArgs
from servelab.mini.engine.engine import Engine
from servelab.mini.engine.sampling import SamplingParams
from servelab.mini.model import tokenizer as tk


def variant_args(name: str, a: argparse.Namespace, backend: str) -> EngineArgs:
    """EngineArgs for a variant name like 'graph+mtp' or 'mtp2'."""
    parts = set(name.split("+"))
    spec = next((p for p in parts if p.startswith("mtp")), None)
    steps = int(spec[3:]) if spec and len(spec) > 3 else 1
    return EngineArgs(config=a.config, device=a.device, random_weights=a.random_weights,
                      max_running_requests=max(a.concurrency),
                      context_length=a.input_len + a.output_len + 8,
                      speculative_algorithm="EAGLE" if spec else None,
                      speculative_num_steps=steps, cuda_graph="graph" in parts,
                      attention_backend=backend, num_threads=a.threads)


def sync(dev: str) -> None:
    if dev.startswith("cuda"):
        torch.cuda.synchronize()


CODE: list[bytes] = []  # held-out stdlib files when --code-prompts


def make_prompts(n: int, input_len: int, seed: int) -> list[list[int]]:
    """BOS + input_len - 1 tokens: held-out code (--code-prompts) or random printable ASCII."""
    if CODE:
        from servelab.mini.train import heldout_prompts

        return heldout_prompts(CODE, n, input_len - 1, seed)
    return random_prompts(n, input_len, seed)


def random_prompts(n: int, input_len: int, seed: int) -> list[list[int]]:
    """BOS + input_len - 1 random printable ASCII bytes, n prompts from one seeded generator."""
    g = torch.Generator().manual_seed(seed)
    return [[tk.BOS, *torch.randint(32, 127, (input_len - 1,), generator=g).tolist()]
            for _ in range(n)]


def run_point(eng: Engine, conc: int, n_req: int, input_len: int, output_len: int,
              seed: int) -> dict:
    """Closed loop: keep `conc` requests in flight until n_req have finished."""
    prompts = make_prompts(n_req, input_len, seed)
    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    rec: list[dict] = []
    d0, a0 = eng.stats.spec_num_drafts, eng.stats.spec_num_accepted_tokens
    nxt = 0

    def submit() -> None:
        nonlocal nxt
        r = {"t0": time.perf_counter(), "first": None, "end": None, "n": 0}
        rec.append(r)

        def cb(ev, r=r) -> None:
            now = time.perf_counter()
            if ev.token_ids and r["first"] is None:
                r["first"] = now
            r["n"] = ev.completion_tokens
            if ev.finish_reason is not None:
                r["end"] = now
                if nxt < n_req:
                    submit()

        eng.submit(prompts[nxt], params, cb)
        nxt += 1

    t0 = time.perf_counter()
    for _ in range(min(conc, n_req)):
        submit()
    while any(r["end"] is None for r in rec) or nxt < n_req:
        eng.step()
    sync(eng.args.device)
    wall = time.perf_counter() - t0
    toks = sum(r["n"] for r in rec)
    tpot = [(r["end"] - r["first"]) / (r["n"] - 1) * 1e3 for r in rec if r["n"] > 1]
    ttft = [(r["first"] - r["t0"]) * 1e3 for r in rec]
    drafts = eng.stats.spec_num_drafts - d0
    acc = eng.stats.spec_num_accepted_tokens - a0
    return {"concurrency": conc, "requests": n_req, "output_tokens": toks, "wall_s": wall,
            "output_tok_s": toks / wall, "tpot_ms_median": statistics.median(tpot),
            "ttft_ms_median": statistics.median(ttft),
            "accept_length": (1 + acc / drafts) if drafts else None}


def greedy_ids(eng: Engine, input_len: int, n: int = 4, out_len: int = 64) -> list[list[int]]:
    """Greedy token ids for n fixed prompts (for cross-variant equality checks)."""
    params = SamplingParams(max_tokens=out_len, temperature=0.0, ignore_eos=True)
    return [eng.generate(p, params)[0] for p in random_prompts(n, input_len, 123)]


def write_dataset(path: str, n: int, input_len: int, output_len: int, seed: int) -> None:
    """A ShareGPT-format file of code prompts for `servelab bench --dataset`: windows of the
    held-out split of the training recipe (this machine's Python stdlib, read now; nothing is
    shipped). Prompt = input_len - 1 bytes (+ BOS = input_len tokens), reply = output_len bytes
    (the bench derives max_tokens from the reply's /tokenize count)."""
    from servelab.mini.train import load_corpus

    _, held, _ = load_corpus()
    g = torch.Generator().manual_seed(seed)
    items = []
    while len(items) < n:
        f = held[int(torch.randint(0, len(held), (1,), generator=g))]
        if len(f) < 4 * (input_len + output_len):
            continue
        at = int(torch.randint(0, len(f) - 2 * (input_len + output_len), (1,), generator=g))
        at = f.find(b"\n", at) + 1
        chunk = f[at:at + input_len - 1 + output_len - 1]
        if not chunk.isascii():
            continue
        text = chunk.decode()
        items.append({"conversations": [{"from": "human", "value": text[:input_len - 1]},
                                        {"from": "gpt", "value": text[input_len - 1:]}]})
    with open(path, "w") as fh:
        json.dump(items, fh)
    print(f"wrote {n} held-out code prompts to {path}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write-dataset", default=None,
                    help="Only write a ShareGPT-format file of held-out code prompts here.")
    ap.add_argument("--dataset-size", type=int, default=64)
    ap.add_argument("--config", default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--random-weights", action="store_true")
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--variants", default="base,mtp")
    ap.add_argument("--attention-backends", default="torch")
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--requests-per-slot", type=float, default=2.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--check", action="store_true",
                    help="Compare greedy outputs of every variant with the first one's.")
    ap.add_argument("--out", default=None, help="Append JSON lines here.")
    ap.add_argument("--code-prompts", action="store_true",
                    help="Prompts from the held-out split of the training recipe (tiny).")
    a = ap.parse_args(argv)
    if a.code_prompts:
        from servelab.mini.train import load_corpus

        CODE.extend(load_corpus()[1])
    if a.write_dataset:
        write_dataset(a.write_dataset, a.dataset_size, a.input_len, a.output_len, 0)
        return
    a.concurrency = [int(c) for c in a.concurrency.split(",")]
    rows, ref = [], None
    for backend in a.attention_backends.split(","):
        for v in a.variants.split(","):
            try:
                t = time.perf_counter()
                eng = Engine(variant_args(v, a, backend))
                eng.warmup()
                setup = time.perf_counter() - t
                if a.check:
                    got = greedy_ids(eng, a.input_len, out_len=a.output_len)
                    ref = ref if ref is not None else got
                    same = sum(x == y for x, y in zip(got, ref, strict=True))
                    print(f"check {v}/{backend}: {same}/{len(ref)} greedy outputs identical to "
                          "the first variant's", flush=True)
                for c in a.concurrency:
                    n = max(3, int(round(a.requests_per_slot * c)))
                    run_point(eng, c, min(c, 2), a.input_len, min(a.output_len, 16), 1)  # warm
                    r = run_point(eng, c, n, a.input_len, a.output_len, 0)
                    r |= {"config": a.config, "device": a.device, "variant": v,
                          "attention_backend": backend, "setup_s": round(setup, 1),
                          "input_len": a.input_len, "output_len": a.output_len}
                    rows.append(r)
                    print(json.dumps(r), flush=True)
                    if a.out:
                        with open(a.out, "a") as f:
                            f.write(json.dumps(r) + "\n")
                del eng
                gc.collect()  # the engine and its GraphRunner refer to each other
                if a.device.startswith("cuda"):
                    torch.cuda.empty_cache()
            except Exception:  # keep measuring the other variants
                print(f"variant {v}/{backend} failed:\n{traceback.format_exc()}", file=sys.stderr,
                      flush=True)
    print(f"\n{'backend':8} {'variant':12} {'C':>4} {'tok/s':>9} {'TPOT ms':>8} {'TTFT ms':>8} "
          f"{'tau':>5}")
    for r in rows:
        tau = f"{r['accept_length']:.2f}" if r["accept_length"] else "-"
        print(f"{r['attention_backend']:8} {r['variant']:12} {r['concurrency']:>4} "
              f"{r['output_tok_s']:9.1f} {r['tpot_ms_median']:8.2f} {r['ttft_ms_median']:8.1f} "
              f"{tau:>5}")


if __name__ == "__main__":
    main(sys.argv[1:])
