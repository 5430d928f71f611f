"""Small engines for the tests of prefill/decode disaggregation (engine/kv_handoff.py,
server/pd/wire.py): run a request to its end, and prefill one into its wire bytes."""

from __future__ import annotations

from servelab.mini.engine.args import EngineArgs
from servelab.mini.engine.engine import Engine
from servelab.mini.engine.kv_handoff import KVHandoff
from servelab.mini.engine.sampling import SamplingParams
from servelab.mini.server.pd.wire import encode


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
