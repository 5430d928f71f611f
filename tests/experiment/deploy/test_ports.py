"""Engine ports come from below the kernel's ephemeral range (experiment/deploy/ports.py): a port
from that range can be taken by any outgoing connection before the engine binds it."""

from __future__ import annotations

import socket

import pytest

from servelab.experiment.deploy import ports


def test_free_ports_lie_below_the_ephemeral_range_and_are_bindable():
    start = ports.ephemeral_start()
    if start is None or start - ports.LOWEST < 1000:
        pytest.skip("no Linux ephemeral range with room below it here")
    got = {ports.free_port() for _ in range(20)}
    assert all(ports.LOWEST <= p < start for p in got), (sorted(got), start)
    for p in got:
        with socket.socket() as s:  # free means: a listener can take it now, binding as the
            # servers do (SO_REUSEADDR: a closed connection's TIME_WAIT on it does not count)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", p))
            s.listen()


def test_a_port_in_use_is_never_returned(monkeypatch):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        busy = held.getsockname()[1]
        picks = iter([busy, busy, 23456])
        monkeypatch.setattr(ports, "ephemeral_start", lambda: 40000)
        monkeypatch.setattr(ports.random, "randrange", lambda a, b: next(picks))
        if not ports.port_free("127.0.0.1", 23456):
            pytest.skip("23456 is taken on this machine")
        assert ports.free_port() == 23456


def test_unknown_or_small_range_falls_back_to_the_kernel_choice(tmp_path, monkeypatch):
    bad = tmp_path / "range"
    bad.write_text("garbage\n")
    assert ports.ephemeral_start(bad) is None
    (tmp_path / "r2").write_text("32768\t60999\n")
    assert ports.ephemeral_start(tmp_path / "r2") == 32768
    monkeypatch.setattr(ports, "ephemeral_start", lambda: 10500)   # no room below: bind(0)
    p = ports.free_port()
    assert 0 < p < 65536 and ports.port_free("127.0.0.1", p)
