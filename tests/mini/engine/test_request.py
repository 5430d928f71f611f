"""A request's record (engine/request.py): how sampled tokens become its text and when it
finishes (EOS, stop strings held back until the next tokens tell, max_tokens), its random
stream, the lifetime counters, and delivery to a listener that fails. The first test runs the
same rules through a real engine."""

from __future__ import annotations

import pytest
from mini_engines import GREEDY, engine

from servelab.errors import UserError
from servelab.mini.engine.request import Event, Request, Stats, deliver, generator, stop_prefix_len
from servelab.mini.engine.sampling import SamplingParams
from servelab.mini.model import tokenizer as tk


def test_stop_strings_min_tokens_and_max_tokens():
    eng = engine("tiny")
    p = tk.encode("import os\nimport sys\n\n\ndef main(argv):\n")
    ids, text, ev = eng.generate(p, SamplingParams(max_tokens=60, **GREEDY))
    assert len(ids) == 60 and ev.finish_reason == "length" and ev.completion_tokens == 60
    assert text == tk.decode(ids)
    stop = text[20:23]  # a string that greedy decoding will produce
    cut = text.find(stop)
    _, text2, ev2 = eng.generate(p, SamplingParams(max_tokens=60, stop=(stop,), **GREEDY))
    assert ev2.finish_reason == "stop" and text2 == text[:cut]
    # EOS: forbidden before min_tokens, allowed after (unless ignore_eos)
    ids3, _, ev3 = eng.generate([tk.BOS], SamplingParams(max_tokens=40, temperature=0.0,
                                                         min_tokens=40))
    assert tk.EOS not in ids3 and len(ids3) == 40


def _request(**params) -> Request:
    return Request(0, [tk.BOS], SamplingParams(**params), lambda ev: None)


def _bytes(s: str) -> list[int]:
    return list(s.encode())


def test_text_that_may_start_a_stop_string_is_held_until_the_next_tokens_tell():
    r = _request(max_tokens=50, stop=("END",))
    assert r.take(_bytes("abE")) == ("ab", _bytes("abE"))  # "E" may begin "END"
    assert r.take(_bytes("x")) == ("Ex", _bytes("x"))  # it did not
    text, taken = r.take(_bytes("yENDz"))
    assert (text, taken, r.finish) == ("y", _bytes("yEND"), "stop")  # "z" is never taken
    assert r.out == _bytes("abExyEND")


def test_max_tokens_and_eos_end_a_request_and_release_held_text():
    r = _request(max_tokens=3, stop=("ab",))
    assert r.take(_bytes("xya")) == ("xya", _bytes("xya")) and r.finish == "length"
    r = _request(max_tokens=9, stop=("ab",))
    assert r.take([*_bytes("xa"), tk.EOS, 99]) == ("xa", [*_bytes("xa"), tk.EOS])
    assert r.finish == "stop"
    r = _request(max_tokens=3, ignore_eos=True)
    assert r.take([tk.EOS, tk.EOS, tk.EOS, tk.EOS]) == ("", [tk.EOS] * 3)
    assert r.finish == "length"


def test_a_multibyte_character_is_emitted_whole():
    r = _request(max_tokens=9)
    euro = _bytes("€")  # 3 bytes
    assert r.take(euro[:2])[0] == "" and r.take(euro[2:])[0] == "€"


def test_stop_prefix_len_is_the_longest_proper_prefix_at_the_end():
    assert stop_prefix_len("abc", ("cde",)) == 1
    assert stop_prefix_len("abcd", ("cdx", "bcdy")) == 3
    assert stop_prefix_len("xab", ("abc",)) == 2
    assert stop_prefix_len("abc", ("abc",)) == 0  # proper prefixes only: a whole one is a hit
    assert stop_prefix_len("abc", ("x",)) == 0 and stop_prefix_len("", ("ab",)) == 0


def test_a_request_random_stream_follows_its_seed():
    assert generator(SamplingParams(temperature=0.0)) is None
    a, b = generator(SamplingParams(seed=5)), generator(SamplingParams(seed=5))
    assert a.get_state().equal(b.get_state())
    assert generator(SamplingParams()) is not None  # unseeded: a fresh draw
    with pytest.raises(UserError, match="seed"):
        generator(SamplingParams(seed=2**70))


def test_stats_count_verify_steps_and_acceptance():
    st = Stats(spec_accepted_per_pos=[0, 0, 0])
    assert st.avg_spec_accept_length is None
    st.verified(3, 2)
    st.verified(3, 0)
    assert (st.spec_num_drafts, st.spec_num_draft_tokens, st.spec_num_accepted_tokens) == (2, 6, 2)
    assert st.spec_accepted_per_pos == [1, 1, 0] and st.avg_spec_accept_length == 2.0


def test_a_failing_listener_is_reported_not_raised():
    got: list[Event] = []
    ok = Request(0, [tk.BOS], SamplingParams(), got.append)
    ev = Event("a", [97], None, 1, 1, 0)
    assert deliver(ok, ev) and got == [ev]

    def boom(_ev: Event) -> None:
        raise RuntimeError("listener gone")

    assert deliver(Request(1, [tk.BOS], SamplingParams(), boom), ev) is False
