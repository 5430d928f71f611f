"""Planned multi-turn sessions: ShareGPT conversations turn by turn (a leading reply skipped,
the conversation ending where the turns stop alternating), capped by max_turns, cycled when the
file is short; synthetic sessions of S x T turns of exact new text."""

from __future__ import annotations

import asyncio
import random

import orjson
import pytest

from servelab.bench.config import SessionsConfig
from servelab.bench.datasets.sessions import session_specs
from servelab.bench.datasets.sharegpt import sharegpt_conversations
from servelab.bench.scripted.script import count_tokens
from servelab.errors import UserError


async def count(text: str) -> int:  # one token per word, one special token (a BOS)
    return count_tokens(text) + 1


def _msg(role: str, text: str) -> dict:
    return {"from": role, "value": text}


def test_conversations_alternate_from_the_first_human_turn(tmp_path):
    path = tmp_path / "c.json"
    path.write_bytes(orjson.dumps([
        {"conversations": [_msg("gpt", "hello there"), _msg("human", "q1"), _msg("gpt", "a1 a1"),
                           _msg("human", "q2"), _msg("gpt", "a2"), _msg("human", "q3"),
                           _msg("human", "q4"), _msg("gpt", "a4")]},
        {"conversations": [_msg("human", "only a question")]},  # no reply: left out
        {"conversation": [{"role": "user", "content": "u1"}, {"role": "assistant", "content": "r1"}]},
    ]))
    convs = sharegpt_conversations(str(path))
    # two human turns in a row end the first conversation after q2
    assert convs == [[("q1", "a1 a1"), ("q2", "a2")], [("u1", "r1")]]
    empty = tmp_path / "e.json"
    empty.write_bytes(orjson.dumps([{"conversations": [_msg("gpt", "x"), _msg("gpt", "y")]}]))
    with pytest.raises(UserError, match="no conversation with a human turn followed by a reply"):
        sharegpt_conversations(str(empty))


def test_sharegpt_sessions_capped_and_cycled(tmp_path):
    path = tmp_path / "c.json"
    turns = [m for k in range(4) for m in (_msg("human", f"q{k} " * (k + 1)),
                                           _msg("gpt", f"a{k} " * (2 * k + 1)))]
    path.write_bytes(orjson.dumps([{"conversations": turns}]))
    cfg = SessionsConfig(num_sessions=2, max_turns=3)
    specs = asyncio.run(session_specs(cfg, 99, 99, str(path), random.Random(0), count, 4))
    # one conversation, two sessions: cycled, each its own id; 3 turns of 4 kept
    assert [(s.session_id, s.turn, s.session_turns) for s in specs] == \
        [(sid, t, 3) for sid in ("0", "1") for t in (1, 2, 3)]
    assert [s.index for s in specs] == list(range(6))
    # new text's own tokens (special ones excluded), and the replies' lengths asked
    assert [(s.input_len, s.output_len) for s in specs[:3]] == [(1, 1), (2, 3), (3, 5)]
    assert specs[1].prompt.split() == ["q1", "q1"] and all(s.input_len_exact for s in specs)


def test_synthetic_sessions_have_exact_new_text_per_turn():
    cfg = SessionsConfig(num_sessions=3, turns=4, max_turns=2)
    specs = asyncio.run(session_specs(cfg, 7, 5, None, random.Random(1), count, 4))
    assert len(specs) == 6 and {s.session_turns for s in specs} == {2}
    assert all(count_tokens(s.prompt) == 7 == s.input_len and s.output_len == 5 for s in specs)
    assert len({s.prompt for s in specs}) == 6  # every turn's text its own
    again = asyncio.run(session_specs(cfg, 7, 5, None, random.Random(1), count, 4))
    assert [s.prompt for s in again] == [s.prompt for s in specs]  # the seed decides
