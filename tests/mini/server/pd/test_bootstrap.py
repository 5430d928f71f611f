"""The prefill's bootstrap server over real HTTP on loopback: KV nobody fetches is bounded. Past
`max_pending_bytes` the oldest unfetched rooms are evicted (counted as expired), and their
decode side hears so at once instead of waiting out its timeout; the newer rooms go out whole.
A huge body sent to the bootstrap port is refused and the port keeps serving."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request

import torch

from servelab.mini.engine.kv_handoff import KVHandoff
from servelab.mini.server.pd.bootstrap import BootstrapServer
from servelab.mini.server.pd.wire import TransferStats, decode


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _handoff(room: int) -> KVHandoff:
    kv = torch.full((2, 8, 16), float(room))  # [L, S, kv_dim]: 1024 B
    return KVHandoff(room=room, prompt=list(range(8)), first_token=1, drafts=[], kv=kv,
                     ik=torch.zeros(2, 8, 4), fingerprint="f")


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_unfetched_kv_is_bounded_and_evicted_rooms_fail_at_once():
    one = _handoff(0).kv.nbytes + _handoff(0).ik.nbytes
    stats = TransferStats("sent")
    srv = BootstrapServer("127.0.0.1", _port(), stats, max_pending_bytes=2 * one)
    srv.start()
    try:
        for room in (1, 2, 3):
            srv.put(_handoff(room))
        base = f"http://127.0.0.1:{srv.port}/kv"
        t0 = time.monotonic()
        st, body = _get(f"{base}/1?timeout_s=5")
        assert st == 409 and "evicted" in json.loads(body)["error"], body
        assert time.monotonic() - t0 < 2
        for room in (2, 3):
            st, body = _get(f"{base}/{room}?timeout_s=5")
            assert st == 200
            h = decode(body)
            assert h.room == room and torch.equal(h.kv, _handoff(room).kv)
        # the server counts a fetch after its last byte is written: the client may read the
        # body first (a race seen once in a full-suite run), so give the count a moment
        deadline = time.monotonic() + 5
        while stats.outcomes.get("ok", 0) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert stats.outcomes.get("expired") == 1 and stats.outcomes.get("ok") == 2
        st, body = _get(f"http://127.0.0.1:{srv.port}/route")
        assert json.loads(body)["rooms_pending"] == 0
    finally:
        srv.stop()


def test_a_huge_body_at_the_bootstrap_port_is_refused_and_it_keeps_serving():
    srv = BootstrapServer("127.0.0.1", _port(), TransferStats("sent"))
    srv.start()
    try:
        base = f"http://127.0.0.1:{srv.port}"
        big = b"\0" * (8 << 20)
        for method, want in (("POST", 405), ("GET", 404)):
            req = urllib.request.Request(f"{base}/kv/1?timeout_s=0", data=big, method=method)
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    status = r.status
            except urllib.error.HTTPError as e:
                status = e.code
            assert status == want, (method, status)
        srv.put(_handoff(4))
        st, body = _get(f"{base}/kv/4?timeout_s=5")
        assert st == 200 and decode(body).room == 4
    finally:
        srv.stop()


def test_stop_does_not_wait_for_pending_long_polls():
    """A prefill server stopping with decode sides still waiting closes its bootstrap port at
    once; the waiting fetch fails then instead of at its timeout."""
    from concurrent.futures import ThreadPoolExecutor

    srv = BootstrapServer("127.0.0.1", _port(), TransferStats("sent"))
    srv.start()
    with ThreadPoolExecutor(1) as pool:
        poll = pool.submit(_get_or_error, f"http://127.0.0.1:{srv.port}/kv/5?timeout_s=30")
        time.sleep(0.3)  # the poll is waiting
        t0 = time.monotonic()
        srv.stop()
        assert time.monotonic() - t0 < 2
        assert poll.result(timeout=5) != 200
    assert time.monotonic() - t0 < 5


def _get_or_error(url: str) -> int | str:
    try:
        return _get(url)[0]
    except OSError as exc:  # the connection was cut
        return type(exc).__name__


def _route(srv: BootstrapServer) -> dict:
    return json.loads(_get(f"http://127.0.0.1:{srv.port}/route")[1])


def test_abandoned_long_polls_are_cancelled():
    """Polls whose client went away used to run until their timeout_s (up to an hour): about
    115 MB per 10,000 of them. They end when their connection does."""
    srv = BootstrapServer("127.0.0.1", _port(), TransferStats("sent"))
    srv.start()
    polls = []
    try:
        for room in range(200):
            c = socket.create_connection(("127.0.0.1", srv.port))
            c.sendall(f"GET /kv/{room % 50}?timeout_s=3600 HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            polls.append(c)
        deadline = time.monotonic() + 10
        while len(srv._ready) < 50 and time.monotonic() < deadline:  # an event per room
            time.sleep(0.05)
        time.sleep(0.2)
        assert len(srv._ready) == 50
        for c in polls:
            c.close()
        deadline = time.monotonic() + 5
        while srv._ready and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not srv._ready, f"{len(srv._ready)} rooms still polled by nobody"
        assert _route(srv)["polls_waiting"] == 0 and not srv._pollers
        srv.put(_handoff(7))  # and the port serves on
        st, body = _get(f"http://127.0.0.1:{srv.port}/kv/7?timeout_s=5")
        assert st == 200 and decode(body).room == 7
    finally:
        for c in polls:
            c.close()
        srv.stop()


def test_a_room_of_thousands_of_digits_is_a_one_line_400():
    """int() of 8,000 digits raised ValueError (Python's digit limit): a plain-text 500 and
    a logged traceback."""
    srv = BootstrapServer("127.0.0.1", _port(), TransferStats("sent"))
    srv.start()
    try:
        for room in ("9" * 8000, "1" * 21, "0" * 4301):
            st, body = _get(f"http://127.0.0.1:{srv.port}/kv/{room}?timeout_s=0")
            err = json.loads(body)["error"]
            assert st == 400 and "ROOM an integer" in err and "\n" not in err, (st, body[:80])
    finally:
        srv.stop()
