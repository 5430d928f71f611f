"""Train the `tiny` model reproducibly: main model and MTP head jointly, on the source code of the
Python standard library that is installed on the machine (read at training time; no text is
shipped or downloaded).

    python -m servelab.mini.train [--steps N | --budget-s S] [--device cuda] [--out PATH]

Data recipe: every `*.py` file under `sysconfig.get_paths()["stdlib"]` except `test/`, `idlelib/`
and `site-packages/`, sorted by relative path; a file is held out when sha1(relative path) % 20
== 0. Training files are joined with EOS between them; a sample is BOS + a window of seq-1 tokens
at a seeded random offset. Loss = CE(main, t+1) + lambda * CE(MTP, t+2) (lambda 0.3, as in
DeepSeek-V3's first phase) + indexer KL (its inputs are detached, so it trains only the indexer)
+ 0.01 * MoE balance. AdamW, warm-up then cosine decay. With `--budget-s` the step count is chosen
from the speed of the first steps and recorded, so `--steps N` reproduces the run.

Afterwards the checkpoint is evaluated: held-out losses and greedy MTP acceptance (the rate at
which the MTP draft of the 2nd token matches the main model's greedy token) through the real
engine with speculative decoding.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import platform
import sys
import sysconfig
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from servelab import atomic
from servelab.mini.engine.args import EngineArgs
from servelab.mini.engine.engine import Engine
from servelab.mini.engine.sampling import SamplingParams
from servelab.mini.model import tokenizer as tk
from servelab.mini.model.checkpoint import WEIGHTS_DIR, save
from servelab.mini.model.config import get_config
from servelab.mini.model.model import MiniModel

EXCLUDE = ("test/", "tests/", "idlelib/", "site-packages/", "lib2to3/tests/")


def stdlib_files() -> tuple[Path, list[str]]:
    """(stdlib root, sorted relative paths of the .py files in the recipe)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    rels = sorted(str(p.relative_to(root)) for p in root.rglob("*.py"))
    return root, [r for r in rels if not any(r.startswith(e) or f"/{e}" in r for e in EXCLUDE)]


def held_out(rel: str) -> bool:
    """The held-out split: 1 file in 20, by hash of the relative path."""
    return int(hashlib.sha1(rel.encode()).hexdigest(), 16) % 20 == 0


def load_corpus() -> tuple[torch.Tensor, list[bytes], dict]:
    """(training tokens as int16 with EOS between files, held-out file contents, recipe info)."""
    root, rels = stdlib_files()
    train, held = [], []
    for rel in rels:
        try:
            data = (root / rel).read_bytes()
        except OSError:
            continue
        if data:
            (held if held_out(rel) else train).append(data)
    parts = []
    for data in train:
        parts.append(torch.frombuffer(bytearray(data), dtype=torch.uint8).to(torch.int16))
        parts.append(torch.tensor([tk.EOS], dtype=torch.int16))
    corpus = torch.cat(parts)
    info = {"source": "python stdlib *.py", "python": platform.python_version(),
            "stdlib": str(root), "exclude": list(EXCLUDE), "train_files": len(train),
            "heldout_files": len(held), "train_tokens": int(corpus.numel()),
            "heldout_rule": "sha1(relpath) % 20 == 0"}
    return corpus, held, info


def batch(corpus: torch.Tensor, n: int, seq: int, gen: torch.Generator,
          device: str) -> torch.Tensor:
    """n samples: BOS + corpus[off : off + seq - 1] at seeded random offsets."""
    off = torch.randint(0, corpus.numel() - seq, (n,), generator=gen, device=corpus.device)
    idx = off[:, None] + torch.arange(seq - 1, device=corpus.device)
    x = corpus[idx].long()
    bos = torch.full((n, 1), tk.BOS, dtype=torch.long, device=corpus.device)
    return torch.cat((bos, x), dim=1).to(device)


def losses(model: MiniModel, tokens: torch.Tensor, mtp_weight: float) -> dict[str, torch.Tensor]:
    """All loss terms for a batch [B, S]."""
    out = model.forward_train(tokens)
    v = model.cfg.vocab_size
    main = F.cross_entropy(out["logits"][:, :-1].reshape(-1, v).float(), tokens[:, 1:].reshape(-1))
    mtp = F.cross_entropy(out["mtp_logits"][:, :-1].reshape(-1, v).float(),
                          tokens[:, 2:].reshape(-1))
    total = main + mtp_weight * mtp + out["indexer_kl"] + 0.01 * out["balance"]
    return {"total": total, "main": main, "mtp": mtp, "indexer_kl": out["indexer_kl"],
            "balance": out["balance"]}


def heldout_batches(held: list[bytes], seq: int, n: int, seed: int) -> torch.Tensor:
    """n fixed held-out samples (BOS + seq-1 bytes)."""
    g = torch.Generator().manual_seed(seed + 1)
    data = torch.frombuffer(bytearray(b"\x00".join(held)), dtype=torch.uint8).long()
    off = torch.randint(0, data.numel() - seq, (n,), generator=g)
    x = data[off[:, None] + torch.arange(seq - 1)]
    return torch.cat((torch.full((n, 1), tk.BOS), x), dim=1)


def heldout_prompts(held: list[bytes], n: int, length: int, seed: int) -> list[list[int]]:
    """n held-out prompts of `length` bytes, each starting at a line start."""
    g = torch.Generator().manual_seed(seed + 2)
    out = []
    while len(out) < n:
        f = held[int(torch.randint(0, len(held), (1,), generator=g))]
        if len(f) < 4 * length:
            continue
        at = int(torch.randint(0, len(f) - 2 * length, (1,), generator=g))
        at = f.find(b"\n", at) + 1
        text = f[at:at + length]
        if len(text) == length and text.isascii():
            out.append([tk.BOS, *text])
    return out


def eval_acceptance(weights: Path, device: str, prompts: list[list[int]], gen_len: int,
                    steps: int) -> dict:
    """Greedy decoding with MTP speculation through the engine; acceptance per draft position."""
    eng = Engine(EngineArgs(config="tiny", weights=str(weights), device=device,
                            max_running_requests=len(prompts), context_length=1024,
                            speculative_algorithm="EAGLE", speculative_num_steps=steps,
                            num_threads=torch.get_num_threads()))
    done: list[int] = []
    for p in prompts:
        eng.submit(p, SamplingParams(max_tokens=gen_len, temperature=0.0, ignore_eos=True),
                   lambda ev: done.append(1) if ev.finish_reason else None)
    while len(done) < len(prompts):
        eng.step()
    st = eng.stats
    return {"num_steps": steps, "drafts": st.spec_num_drafts,
            "accept_rate_per_pos": [a / st.spec_num_drafts for a in st.spec_accepted_per_pos],
            "accept_length": st.avg_spec_accept_length, "prompts": len(prompts),
            "prompt_bytes": len(prompts[0]) - 1, "gen_tokens": gen_len}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=None, help="Optimizer steps (reproducible).")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="Choose --steps from the speed of the first 30 steps to fit this budget.")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, default=WEIGHTS_DIR / "tiny.pt")
    ap.add_argument("--eval-only", action="store_true", help="Evaluate --out, do not train.")
    ap.add_argument("--eval-prompts", type=int, default=32)
    ap.add_argument("--log-every", type=int, default=100)
    a = ap.parse_args(argv)
    if a.steps is None and a.budget_s is None and not a.eval_only:
        ap.error("give --steps N (reproducible) or --budget-s S")
    corpus, held, recipe = load_corpus()
    print(f"corpus: {recipe['train_files']} files, {recipe['train_tokens']} tokens; "
          f"held out {recipe['heldout_files']} files", flush=True)
    cfg = get_config("tiny")
    dev = a.device
    if not a.eval_only:
        train(a, cfg, corpus, held, recipe)
    prompts = heldout_prompts(held, a.eval_prompts, 128, a.seed)
    acc = {f"steps{k}": eval_acceptance(a.out, dev, prompts, 128, k) for k in (1, 2)}
    long_prompts = heldout_prompts(held, a.eval_prompts, 255, a.seed)  # 256 tokens with BOS
    acc["steps1_256in_256out"] = eval_acceptance(a.out, dev, long_prompts, 256, 1)
    print(json.dumps(acc, indent=2), flush=True)
    if a.eval_only:  # evaluating must never rewrite a checkpoint (the shipped one by default)
        return
    ck = torch.load(a.out, map_location="cpu", weights_only=True)
    ck["meta"]["mtp_acceptance"] = acc
    buf = io.BytesIO()
    torch.save(ck, buf)
    atomic.write_bytes(a.out, buf.getvalue())
    atomic.write_text(a.out.with_suffix(".json"), json.dumps(ck["meta"], indent=2) + "\n")


def choose_steps(a, cfg, corpus: torch.Tensor) -> int:
    """--budget-s: time steps 10-40 of a throw-away model (after CUDA start-up), return the
    step count that fits the budget (a multiple of 100). The real run then starts from the
    seed, so `--steps N` reproduces it."""
    dev = a.device
    torch.manual_seed(a.seed + 1000)
    model = MiniModel(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev.startswith("cuda"))
    gen = torch.Generator(device=dev).manual_seed(a.seed + 1000)
    c = corpus.to(dev)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if dev.startswith("cuda") else (
        torch.autocast("cpu", enabled=False))
    t10 = time.perf_counter()
    for i in range(40):
        if i == 10:
            if dev.startswith("cuda"):
                torch.cuda.synchronize()
            t10 = time.perf_counter()
        with amp:
            loss = losses(model, batch(c, a.batch, a.seq, gen, dev), cfg.mtp_loss_weight)["total"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    if dev.startswith("cuda"):
        torch.cuda.synchronize()
    per = (time.perf_counter() - t10) / 30
    steps = max(100, int(a.budget_s / per) // 100 * 100)
    print(f"{per * 1e3:.1f} ms/step -> --steps {steps}", flush=True)
    return steps


def train(a, cfg, corpus: torch.Tensor, held: list[bytes], recipe: dict) -> None:
    """The optimisation loop; writes the checkpoint with its recipe and final losses."""
    dev = a.device
    torch.manual_seed(a.seed)
    model = MiniModel(cfg).to(dev)
    corpus = corpus.to(dev)
    gen = torch.Generator(device=dev).manual_seed(a.seed)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": other, "weight_decay": 0.0}], lr=a.lr,
                            betas=(0.9, 0.95), fused=dev.startswith("cuda"))
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if dev.startswith("cuda") else (
        torch.autocast("cpu", enabled=False))
    if a.steps is None:
        a.steps = choose_steps(a, cfg, corpus)
    steps = a.steps
    warm = min(200, max(1, steps // 10))
    t0 = time.perf_counter()
    step, log = 0, []
    while step < steps:
        total = steps
        lr = a.lr * min(1.0, (step + 1) / warm) * (
            0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, step / total))))
        for g in opt.param_groups:
            g["lr"] = lr
        x = batch(corpus, a.batch, a.seq, gen, dev)
        with amp:
            ls = losses(model, x, cfg.mtp_loss_weight)
        opt.zero_grad(set_to_none=True)
        ls["total"].backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % a.log_every == 0 or step == steps:
            row = {k: round(float(v.detach()), 4) for k, v in ls.items()} | {"step": step}
            log.append(row)
            print(json.dumps(row), flush=True)
    wall = time.perf_counter() - t0
    model.eval()
    hx = heldout_batches(held, a.seq, 64, a.seed).to(dev)
    with torch.no_grad(), amp:
        hl = {k: round(float(v), 4) for k, v in losses(model, hx, cfg.mtp_loss_weight).items()}
    meta = {"recipe": recipe, "train": {"steps": step, "batch": a.batch, "seq": a.seq,
                                        "lr": a.lr, "seed": a.seed, "device": dev,
                                        "torch": str(torch.__version__), "wall_s": round(wall, 1),
                                        "command": "python -m servelab.mini.train --steps "
                                        f"{step} --batch {a.batch} --seq {a.seq} --seed {a.seed}"},
            "final_train_losses": log[-1] if log else None, "heldout_losses": hl,
            "loss_log": log}
    save(model.float(), a.out, meta)
    print(f"saved {a.out} ({a.out.stat().st_size / 1e6:.1f} MB); held-out {hl}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
