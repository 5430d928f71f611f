"""The KV handoff's wire format (server/pd/wire.py): whatever bytes a peer sends on the
bootstrap port decode to a handoff or to a TransferError naming what is wrong, and what decodes
either passes the decode engine's check or is refused by it."""

from __future__ import annotations

import pytest
from mini_pd import engine, prefill

from servelab.mini.engine.kv_handoff import TransferError
from servelab.mini.engine.sampling import SamplingParams
from servelab.mini.model import tokenizer as tk
from servelab.mini.server.pd.wire import decode


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
                  {"bytes": [1, 2]}, {"version": None}, {"first_token": 1.5},
                  {"cached_tokens": -1}, {"cached_tokens": 99}, {"cached_tokens": "16"}]
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
    # the prefix cache's count is reported only: a peer that sends none means 0
    assert decode(_reframe(wire, cached_tokens=None)).cached_tokens == 0
    assert decode(_reframe(wire, cached_tokens=3)).cached_tokens == 3


@pytest.mark.parametrize("dim", [2**63, 2**62, 10**30, 2**31])
def test_every_size_is_checked_before_anything_is_allocated(dim):
    """`kv_shape [0, S, 2^63]` with zero bytes is self-consistent (0 elements), and
    torch.empty refused it with a C++ traceback: a 500 instead of the decode server's 502."""
    pre = engine("micro")
    prompt = tk.encode("hello")
    wire, _ = prefill(pre, prompt, SamplingParams(max_tokens=4, temperature=0.0), room=5)
    hostile = _reframe(wire, tail=b"", bytes=[0, 0, 0], kv_shape=[0, len(prompt), dim],
                       ik_shape=[0, len(prompt), dim])
    hostile = hostile[:8 + int.from_bytes(hostile[4:8], "big")]  # no tensor bytes at all
    with pytest.raises(TransferError, match="malformed") as ei:
        decode(hostile)
    assert "\n" not in str(ei.value) and len(str(ei.value)) < 400


def test_a_peers_text_never_brings_control_characters_into_an_error():
    pre, dec = engine("micro"), engine("micro")
    prompt = tk.encode("hello")
    wire, _ = prefill(pre, prompt, SamplingParams(max_tokens=4, temperature=0.0), room=5)
    evil = "\x1b]0;pwned\x07\x1b[31m\nX: 1\r\x00"
    for hostile, check in ((_reframe(wire, version=evil), False),
                           (_reframe(wire, fingerprint=evil), True)):
        with pytest.raises(TransferError) as ei:
            h = decode(hostile)
            if check:
                dec.check_handoff(h, prompt, room=5)
        assert not any(c in str(ei.value) for c in evil if not c.isprintable()), str(ei.value)
