"""Request validation at the HTTP boundary (server/protocol.py), without a server: every body the
engine could choke on is refused with an ApiError naming the field (its status, message and
`param`), and valid bodies become the prompt ids and sampling parameters the engine runs. The
same rules through a real server, which keeps serving after each refusal, are
scenarios/test_server.py and scenarios/test_server_properties.py."""

from __future__ import annotations

import json

import pytest

from servelab.mini.model import tokenizer as tk
from servelab.mini.server.protocol import (
    MAX_STOPS,
    ApiError,
    DetokenizeRequest,
    StartProfileRequest,
    TokenizeRequest,
    parse,
    parse_chat,
    parse_completion,
    parse_generate,
)

CTX = 512


def _refused(fn, body: dict | str, word: str, param: str | None = None) -> ApiError:
    """`fn(body)` raises an ApiError 400 whose message holds `word` (and names `param`)."""
    if isinstance(body, str):
        body = json.loads(body)  # Python's reader takes NaN and Infinity, as the server's does
    with pytest.raises(ApiError) as ei:
        fn(body, CTX)
    err = ei.value
    assert err.status == 400 and word in err.message, err.message
    assert "\n" not in err.message
    if param is not None:
        assert err.param == param, err.param
    return err


@pytest.mark.parametrize("body,word,param", [
    ({"prompt": "x", "max_tokens": "ten"}, "max_tokens", "max_tokens"),
    ({"prompt": "x", "max_tokens": 600}, "context length", "max_tokens"),
    ({"prompt": "x" * 600}, "context length", None),
    ({"prompt": "x", "temperature": -1}, "temperature", "temperature"),
    ({"prompt": "x", "max_tokens": 0}, "'max_tokens'", "max_tokens"),
    ('{"prompt":"hi","max_tokens":4,"temperature":NaN}', "'temperature': must be a finite number",
     "temperature"),
    ('{"prompt":"hi","max_tokens":4,"top_p":Infinity}', "top_p", "top_p"),
    ('{"prompt":"\\ud800 hi","max_tokens":2}', "surrogate", "prompt"),
    ({"prompt": "x", "seed": 2**70, "max_tokens": 2}, "'seed'", "seed"),
    ({"prompt": "x", "max_tokens": True}, "max_tokens", "max_tokens"),
    ({"prompt": "x", "max_tokens": 2.5}, "max_tokens", "max_tokens"),
    ({"prompt": "x", "stop": [""]}, "'stop'", "stop"),
    ({"prompt": "x", "stop": ["a"] * (MAX_STOPS + 1)}, "'stop'", "stop"),
    ({"prompt": "x", "min_tokens": 9, "max_tokens": 3}, "min_tokens", "min_tokens"),
    ({"prompt": "x", "n": 2}, "'n'", "n"),
    ({"max_tokens": 2}, "missing 'prompt'", "prompt"),
    ({"prompt": []}, "non-empty list of token ids", "prompt"),
    ({"prompt": [1, 2, 999]}, "outside the vocabulary", "prompt"),
    ({"prompt": ["a", "b"]}, "one prompt per request", "prompt"),
])
def test_bad_completion_bodies_are_refused_naming_the_field(body, word, param):
    _refused(parse_completion, body, word, param)


@pytest.mark.parametrize("body,word", [
    ('{"messages":[{"role":"user","content":"\\udfff"}],"max_tokens":2}', "surrogate"),
    ({"messages": "hi"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "role"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0},
     "max_completion_tokens"),
])
def test_bad_chat_bodies_are_refused_naming_the_field(body, word):
    _refused(parse_chat, body, word)


@pytest.mark.parametrize("body,word", [
    ('{"text":"hi","sampling_params":{"temperature":NaN}}', "sampling_params.temperature"),
    ({"sampling_params": {}}, "text"),
    ({"text": "hi", "sampling_params": {"max_new_tokens": 0}}, "max_new_tokens"),
    ({"text": "hi", "sampling_params": {"min_new_tokens": 5, "max_new_tokens": 2}},
     "min_new_tokens"),
    ({"input_ids": [[1], [2]]}, "input_ids"),
])
def test_bad_generate_bodies_are_refused_naming_the_field(body, word):
    _refused(parse_generate, body, word)


def test_a_completion_becomes_prompt_ids_and_sampling_params():
    ids, sp, stream, include_usage = parse_completion(
        {"prompt": "ab", "stream": True, "stream_options": {"include_usage": True},
         "stop": "\n", "seed": 3, "temperature": 0, "unknown_field": [1]}, CTX)
    assert ids == tk.encode("ab") and stream and include_usage
    assert sp.max_tokens == 16 and sp.stop == ("\n",) and sp.seed == 3 and sp.greedy
    ids, sp, stream, include_usage = parse_completion({"prompt": [[256, 97]]}, CTX)
    assert ids == [256, 97] and not stream and not include_usage
    assert (sp.temperature, sp.top_p, sp.ignore_eos, sp.min_tokens) == (1.0, 1.0, False, 0)
    _, sp, _, _ = parse_completion({"prompt": "x" * 500}, CTX)  # 501 tokens: 11 left
    assert sp.max_tokens == 11
    _, sp, _, _ = parse_completion({"prompt": "x", "max_tokens": 3.0}, CTX)  # JSON's 3.0 is 3
    assert sp.max_tokens == 3


def test_a_chat_uses_the_template_and_max_completion_tokens_first():
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    ids, sp, _, _ = parse_chat({"messages": msgs, "max_tokens": 5,
                                "max_completion_tokens": 7}, CTX)
    assert ids == tk.apply_chat_template(msgs) and sp.max_tokens == 7
    ids, sp, _, _ = parse_chat({"messages": msgs}, CTX)  # no default: the whole context left
    assert sp.max_tokens == CTX - len(ids)


def test_generate_reads_sglang_sampling_params():
    ids, sp, stream = parse_generate({"text": "hi", "stream": True, "sampling_params": {
        "max_new_tokens": 9, "min_new_tokens": 2, "ignore_eos": True}}, CTX)
    assert ids == tk.encode("hi") and stream
    assert (sp.max_tokens, sp.min_tokens, sp.ignore_eos) == (9, 2, True)
    ids, sp, stream = parse_generate({"input_ids": [256, 104, 105]}, CTX)
    assert ids == [256, 104, 105] and sp.max_tokens == 128 and not stream


def test_the_other_bodies_parse_or_name_their_field():
    assert parse(TokenizeRequest, {"prompt": "hi"}).add_special_tokens is True
    assert parse(DetokenizeRequest, {"tokens": [1, 2.0]}).tokens == [1, 2]
    with pytest.raises(ApiError, match="'num_steps'") as ei:
        parse(StartProfileRequest, {"num_steps": 0})
    assert ei.value.param == "num_steps"
    with pytest.raises(ApiError, match="'activities.0'"):
        parse(StartProfileRequest, {"activities": ["TPU"]})
    with pytest.raises(ApiError, match="'prompt'"):
        parse(TokenizeRequest, {"prompt": 5})
    with pytest.raises(ApiError, match="'tokens.1'"):
        parse(DetokenizeRequest, {"tokens": [1, True]})
