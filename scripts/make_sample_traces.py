#!/usr/bin/env python3
"""Write the small sample traces of examples/traces/, one per format servelab replays
(`servelab bench --dataset-name trace --dataset-path FILE`), with the columns and units of the
real traces they imitate (src/servelab/bench/datasets/trace.py; docs/EXPERIMENTS.md says where
the real ones are):

- mooncake_sample.jsonl: Mooncake FAST'25 (kvcache-ai/Mooncake, FAST25-release/traces):
  timestamp in ms, input_length, output_length, hash_ids of 512-token blocks; requests share a
  system-prompt block and some share a document, as the toolagent trace does;
- bailian_sample.jsonl: Qwen Bailian (alibaba-edu/qwen-bailian-usagetraces-anon): chat_id,
  parent_chat_id, timestamp in seconds, input_length, output_length, type, turn, hash_ids of
  16-token blocks; multi-turn chats whose every turn resends the history (its full blocks);
- azure_sample.csv: Azure LLM inference trace (Azure/AzurePublicDataset): TIMESTAMP as a date
  and time with 7 fractional digits, ContextTokens, GeneratedTokens;
- burstgpt_sample.csv: BurstGPT (HPMLL/BurstGPT): Timestamp in seconds, Model, Request tokens,
  Response tokens, Total tokens, Log Type, with a failed request (0 response tokens).

Every file has bursts (several requests in the same millisecond) and lasts about 20 s at speed 1.
Lengths are small (under 1k tokens; Mooncake's 512-token blocks make up to ~2k) so that the
samples run in seconds against the scripted server or the embedded engine. Seeded: running it
again writes the same files.

    python scripts/make_sample_traces.py [--out examples/traces] [--seed 0]
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import random
from pathlib import Path


def arrivals(rng: random.Random, n: int, span_s: float = 20.0) -> list[float]:
    """n arrival times in seconds: Poisson, with a burst of 4-8 requests in one ms every ~12."""
    out: list[float] = []
    t = 0.0
    while len(out) < n:
        t += rng.expovariate(n / span_s)
        k = rng.randint(4, 8) if rng.random() < 0.08 else 1
        out += [round(t, 3)] * k
    return out[:n]


def mooncake(rng: random.Random, n: int = 60) -> list[dict]:
    """A shared system block (id 0) on most requests, documents reused by a few, unique tails."""
    block, next_id = 512, 1
    docs: list[list[int]] = []
    rows = []
    for t in arrivals(rng, n):
        ids = [0] if rng.random() < 0.7 else []
        if docs and rng.random() < 0.4:
            ids += rng.choice(docs)
        else:
            doc = list(range(next_id, next_id + rng.randint(0, 2)))
            next_id += len(doc)
            if doc:
                docs.append(doc)
            ids += doc
        tail = rng.randint(1, 2)
        ids += list(range(next_id, next_id + tail))
        next_id += tail
        length = (len(ids) - 1) * block + rng.randint(16, block)
        rows.append({"timestamp": int(t * 1000), "input_length": length,
                     "output_length": rng.randint(4, 64), "hash_ids": ids})
    return rows


def bailian(rng: random.Random, n: int = 60) -> list[dict]:
    """Chats of 1-4 turns; turn k resends turns 1..k-1 and the answers: the previous turn's full
    blocks keep their ids, its partial last block does not (grown into a full block of other
    tokens, it hashes to a new id, as in the real trace)."""
    block, next_id, chat_id = 16, 0, 0
    open_chats: list[dict] = []
    rows = []
    for t in arrivals(rng, n):
        if open_chats and rng.random() < 0.5:
            c = rng.choice(open_chats)
            parent, turn, ids = c["chat_id"], c["turn"] + 1, list(c["full"])
        else:
            parent, turn, ids = -1, 1, []
        new = rng.randint(2, 10)
        ids += list(range(next_id, next_id + new))
        next_id += new
        length = (len(ids) - 1) * block + rng.randint(1, block)
        row = {"chat_id": chat_id, "parent_chat_id": parent, "timestamp": round(t, 3),
               "input_length": length, "output_length": rng.randint(4, 64), "type": "text",
               "turn": turn, "hash_ids": ids}
        chat_id += 1
        rows.append(row)
        open_chats = [c for c in open_chats if c["chat_id"] != parent] if parent >= 0 else open_chats
        if turn < 4:
            full = ids if length % block == 0 else ids[:-1]
            open_chats.append({**row, "full": full})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="examples/traces")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(a.seed)
    for name, rows in (("mooncake_sample.jsonl", mooncake(rng)), ("bailian_sample.jsonl", bailian(rng))):
        (out / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    start = dt.datetime(2023, 11, 16, 18, 17, 3, 979960)
    with open(out / "azure_sample.csv", "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
        for t in arrivals(rng, 60):
            ts = start + dt.timedelta(seconds=t)
            w.writerow([ts.strftime("%Y-%m-%d %H:%M:%S.%f") + "0", rng.randint(16, 800),
                        rng.randint(4, 64)])
    with open(out / "burstgpt_sample.csv", "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens",
                    "Log Type"])
        for i, t in enumerate(arrivals(rng, 60)):
            req, res = rng.randint(16, 800), 0 if i == 7 else rng.randint(4, 64)
            w.writerow([int(5 + t) if i % 2 else round(5 + t, 3), rng.choice(["ChatGPT", "GPT-4"]),
                        req, res, req + res, rng.choice(["Conversation log", "API log"])])


if __name__ == "__main__":
    main()
