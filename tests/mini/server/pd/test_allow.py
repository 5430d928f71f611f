"""The decode server's allow-list of bootstrap hosts (server/pd/allow.py) and its flag: names
match as names (never resolved per request), addresses and networks as addresses; a bad entry
is refused by `servelab serve` (and `run --check`) with one line."""

from __future__ import annotations

import pytest

from servelab.errors import UserError
from servelab.mini.server.args import ServeArgs, host_list
from servelab.mini.server.pd.allow import BootstrapHosts


def test_loopback_and_named_hosts_only():
    hosts = BootstrapHosts.of(["prefill-1.internal", "10.0.0.0/8", "192.0.2.7", "[fd00::5]"],
                              machine=False)
    for ok in ("127.0.0.1", "::1", "localhost", "LOCALHOST", "prefill-1.internal",
               "prefill-1.internal.", "10.200.3.4", "192.0.2.7", "fd00::5",
               "::ffff:127.0.0.1", "::ffff:10.1.1.1"):
        assert hosts.allows(ok), ok
    for bad in ("127.0.0.2", "0.0.0.0", "169.254.169.254", "192.0.2.8", "example.com",
                "prefill-2.internal", "127.1", "2130706433", "fd00::6", "11.0.0.1"):
        assert not hosts.allows(bad), bad
    assert BootstrapHosts.of(["*"], machine=False).allows("203.0.113.9")


def test_this_machines_own_names_are_allowed_by_default():
    import socket

    assert BootstrapHosts.of([]).allows(socket.gethostname())


@pytest.mark.parametrize("value", ["a/b", "host name", "10.0.0.0/99", "x,,y", "ä.example"])
def test_a_bad_entry_is_one_line(value):
    with pytest.raises(UserError) as ei:
        ServeArgs.from_flags({"disaggregation-allowed-bootstrap-hosts": value})
    msg = str(ei.value)
    assert msg.startswith("--disaggregation-allowed-bootstrap-hosts ") and "\n" not in msg


def test_the_flag_is_normalised():
    a = ServeArgs.from_flags({"disaggregation-allowed-bootstrap-hosts": "Prefill-1, [::1],*"})
    assert host_list(a.disaggregation_allowed_bootstrap_hosts) == ["prefill-1", "::1", "*"]
    assert host_list(ServeArgs.from_flags({}).disaggregation_allowed_bootstrap_hosts) == []
