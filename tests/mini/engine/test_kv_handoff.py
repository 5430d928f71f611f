"""Prefill/decode disaggregation inside the engine (engine/kv_handoff.py): a prefill engine's
exported KV, sent through the wire format, installed into another engine, continues every request exactly as one engine
does alone (greedy, seeded sampling, MTP speculation on decode); a handoff that does not fit
the decode engine is refused with its reason."""

from __future__ import annotations

import pytest
from mini_pd import engine, prefill, run

from servelab.mini.engine.kv_handoff import TransferError
from servelab.mini.engine.sampling import SamplingParams
from servelab.mini.model import tokenizer as tk
from servelab.mini.server.pd.wire import decode

PROMPTS = ["def f(x):\n    return", "import os\nimport sys\n" * 3]


@pytest.mark.parametrize(("config", "steps"), [("micro", 0), ("tiny", 1), ("tiny", 3)])
def test_prefill_then_decode_equals_one_engine(config, steps):
    spec = {"speculative_algorithm": "EAGLE", "speculative_num_steps": steps} if steps else {}
    one, pre, dec = engine(config, **spec), engine(config, **spec), engine(config, **spec)
    for i, text in enumerate(PROMPTS):
        for sp in (SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True),
                   SamplingParams(max_tokens=30, temperature=0.8, seed=11 + i)):
            prompt = tk.encode(text)
            want = run(one, prompt, sp)
            wire, first = prefill(pre, prompt, sp, room=100 + i)
            h = decode(wire)
            dec.check_handoff(h, prompt)
            got = run(dec, prompt, sp, room=h.room, handoff=h)
            assert got == want, f"{config}/{steps} {sp}: PD {got} != one engine {want}"
            assert got[0] == first[0]
            # what went over the wire: every layer's rows of the prompt (+ the MTP layer)
            layers = one.cfg.n_layers + (1 if steps else 0)
            kv_bytes = layers * len(prompt) * (one.cfg.kv_dim + one.cfg.index_dim) * 4
            assert kv_bytes < len(wire) < kv_bytes + 8192
    assert dec.stats.prompt_tokens == 0  # the decode engine computed no prompt
    if steps and config == "tiny":
        assert dec.stats.avg_spec_accept_length > 1.3


def test_a_handoff_that_does_not_fit_is_refused():
    pre, dec_mtp = engine("micro"), engine("micro", speculative_algorithm="EAGLE")
    prompt = tk.encode("hello")
    wire, _ = prefill(pre, prompt, SamplingParams(max_tokens=4, temperature=0.0), room=1)
    h = decode(wire)
    with pytest.raises(TransferError, match="same --speculative"):
        dec_mtp.check_handoff(h, prompt)
    with pytest.raises(TransferError, match="another prompt"):
        engine("micro").check_handoff(h, tk.encode("hellO"))
    with pytest.raises(TransferError, match="another model"):
        engine("micro", seed=1).check_handoff(h, prompt)
    with pytest.raises(TransferError, match="does not match its header"):
        decode(wire[:-3])
    with pytest.raises(TransferError, match="not a KV handoff"):
        decode(b"GET / HTTP/1.1")


def test_bad_handoffs_fail_alone_in_a_batch_of_good_ones():
    """A sampler state of the right length but invalid passed check(), then failed install()
    inside the engine step: the valid requests installed in the same step failed with it, and
    three such steps in a row made /health 503. Each handoff is now checked whole first (as
    the decode server does before submitting), so the bad ones are refused and every good one
    completes as one engine does alone, in batches that mix them."""
    import os
    import struct

    from servelab.mini.engine.args import EngineArgs
    from servelab.mini.engine.engine import Engine

    pre, one = engine("micro"), engine("micro")
    dec = Engine(EngineArgs(config="micro", random_weights=True, context_length=256,
                            max_running_requests=8))
    prompts = [tk.encode(f"def f{i}(x):\n    return") for i in range(4)]
    good, bad = [], []
    for i, prompt in enumerate(prompts):
        sp = SamplingParams(max_tokens=12, temperature=0.8, seed=40 + i, ignore_eos=True)
        wire, _ = prefill(pre, prompt, sp, room=i)
        good.append((prompt, sp, decode(wire), run(one, prompt, sp)))
        (n,) = struct.unpack(">I", wire[4:8])
        ngen = len(wire) - 8 - n - decode(wire).kv.nbytes - decode(wire).ik.nbytes
        bad.append((prompt, sp, decode(wire[:-ngen] + os.urandom(ngen))))
    for _ in range(3):  # three steps, each mixing good and bad handoffs
        outs, submitted = [], 0
        for (prompt, sp, h, want), (bprompt, bsp, bh) in zip(good, bad, strict=True):
            for p, s, hh, w in ((prompt, sp, h, want), (bprompt, bsp, bh, None)):
                try:
                    dec.check_handoff(hh, p, hh.room)
                except TransferError as exc:
                    assert w is None and "sampler state" in str(exc), exc
                    continue
                got: list[int] = []
                done: list[str] = []
                dec.submit(p, s, lambda ev, g=got, d=done: (g.extend(ev.token_ids),
                                                             d.append(ev.finish_reason)),
                           room=hh.room, handoff=hh)
                outs.append((got, done, w))
                submitted += 1
        while not all(d and d[-1] for _, d, _ in outs):
            assert dec.step()
        for got, done, want in outs:
            if want is not None:
                assert done[-1] == "length" and got == want, done
        assert submitted == len(good)
        assert dec.failed_steps == 0 and dec.unhealthy() is None
