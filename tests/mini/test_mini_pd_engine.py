"""Prefill/decode disaggregation inside the engine: a prefill engine's exported KV, sent through
the wire format, installed into another engine, continues every request exactly as one engine
does alone (greedy, seeded sampling, MTP speculation on decode); a handoff that does not fit
the decode engine is refused with its reason."""

from __future__ import annotations

import pytest

from servelab.mini.engine.args import EngineArgs
from servelab.mini.engine.engine import Engine
from servelab.mini.engine.kv_handoff import KVHandoff, TransferError
from servelab.mini.engine.sampling import SamplingParams
from servelab.mini.model import tokenizer as tk
from servelab.mini.server.pd.wire import decode, encode

PROMPTS = ["def f(x):\n    return", "import os\nimport sys\n" * 3]


def engine(config: str, **kw) -> Engine:
    return Engine(EngineArgs(config=config, random_weights=config == "micro",
                             context_length=256, max_running_requests=2, **kw))


def run(eng: Engine, prompt: list[int], sp: SamplingParams, **submit) -> list[int]:
    out: list[int] = []
    done: list[str] = []

    def cb(ev) -> None:
        out.extend(ev.token_ids)
        if ev.finish_reason:
            done.append(ev.finish_reason)

    eng.submit(prompt, sp, cb, **submit)
    while not done:
        assert eng.step(), "engine idle with an unfinished request"
    assert done[0] in ("length", "stop"), done
    return out


def prefill(eng: Engine, prompt: list[int], sp: SamplingParams, room: int) -> tuple[bytes, list[int]]:
    got: list[KVHandoff] = []
    first = run(eng, prompt, sp, room=room, export=got.append)
    assert len(got) == 1 and first == [got[0].first_token]
    return encode(got[0]), first


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


def _reframe(wire: bytes, tail: bytes | None = None, **changes) -> bytes:
    """The handoff `wire` with header fields changed (and its trailing bytes replaced)."""
    import json
    import struct

    (n,) = struct.unpack(">I", wire[4:8])
    hd = json.loads(wire[8:8 + n])
    body = wire[8 + n:]
    for k, v in changes.items():
        if v is None:
            del hd[k]
        else:
            hd[k] = v
    if tail is not None:
        body = body[:hd["bytes"][0] + hd["bytes"][1]] + tail
    head = json.dumps(hd).encode()
    return wire[:4] + struct.pack(">I", len(head)) + head + body


def test_a_broken_or_hostile_handoff_is_refused_with_its_reason():
    """Whatever a peer sends on the bootstrap port: a TransferError naming what is wrong,
    never another exception (the decode server would answer 500) and never a handoff that
    passes check() but fails the engine step it shares with other requests."""
    pre, dec = engine("micro"), engine("micro")
    prompt = tk.encode("hello")
    wire, _ = prefill(pre, prompt, SamplingParams(max_tokens=4, temperature=0.0), room=5)
    bad_header = [{"room": None}, {"room": -1}, {"kv_shape": [-1, 1, 1]}, {"kv_shape": [1, 2]},
                  {"prompt": ["a"]}, {"prompt": [1]}, {"drafts": "xy"}, {"fingerprint": 7},
                  {"bytes": [1, 2]}, {"version": None}, {"first_token": 1.5}]
    for change in bad_header:
        with pytest.raises(TransferError, match="malformed|does not match") as ei:
            decode(_reframe(wire, **change))
        assert "\n" not in str(ei.value)
    with pytest.raises(TransferError, match="malformed"):
        decode(wire[:8] + b"[" * 5000)
    with pytest.raises(TransferError, match="room 5"):
        dec.check_handoff(decode(wire), prompt, room=6)
    with pytest.raises(TransferError, match="outside this model's vocabulary"):
        dec.check_handoff(decode(_reframe(wire, first_token=10**6)), prompt, room=5)
    seeded, _ = prefill(pre, prompt, SamplingParams(max_tokens=4, temperature=0.9, seed=3), 7)
    h = decode(seeded)
    assert h.gen_state is not None
    kv_b, ik_b = h.kv.numel() * 4, h.ik.numel() * 4
    with pytest.raises(TransferError, match="sampler state"):
        dec.check_handoff(decode(_reframe(seeded, tail=b"\0" * 10, bytes=[kv_b, ik_b, 10])),
                        prompt, room=7)
    dec.check_handoff(decode(wire), prompt, room=5)  # the unbroken one passes
