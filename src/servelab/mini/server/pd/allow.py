"""Which `bootstrap_host`s a decode server fetches KV from.

The PD router names the prefill server's host in every request body, so any client that can
reach a decode server could name any host: the decode server would make an HTTP request there
(a server-side request forgery). A decode server therefore fetches only from hosts a deployment
legitimately uses. The router tells it of the prefill servers only per request, so the default
is what a one-machine deployment needs: loopback (127.0.0.1, ::1, localhost) and every address
and name of this machine; `--disaggregation-allowed-bootstrap-hosts HOST[,HOST...]` widens it
with host names, addresses, networks (10.0.0.0/8) or `*` (any host: the old behaviour).

A name is matched as a name, never resolved per request (a client's name could resolve
anywhere); an allowed name's own addresses are allowed too, resolved once at start.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass

IP = ipaddress.IPv4Address | ipaddress.IPv6Address
Net = ipaddress.IPv4Network | ipaddress.IPv6Network
LOOPBACK = ("127.0.0.1", "::1", "localhost")


def parse_entry(entry: str) -> str:
    """One allow-list entry, normalised: `*`, an address, a network or a host name; ValueError
    for anything else (the flag's validator)."""
    e = entry.strip().lower().removeprefix("[").removesuffix("]")
    if e == "*":
        return e
    try:
        return str(ipaddress.ip_address(e))
    except ValueError:
        pass
    if "/" in e:
        try:
            return str(ipaddress.ip_network(e, strict=False))
        except ValueError:
            raise ValueError(f"{entry!r} is not a network (e.g. 10.0.0.0/8)") from None
    if not e or len(e) > 253 or not all(c.isascii() and (c.isalnum() or c in "-._") for c in e):
        raise ValueError(f"{entry!r} is not a host name, address or network")
    return e.rstrip(".")


@dataclass(frozen=True, slots=True)
class BootstrapHosts:
    """An allow-list of bootstrap hosts (see the module docstring)."""

    names: frozenset[str]
    addresses: frozenset[IP]
    networks: tuple[Net, ...] = ()
    any_host: bool = False

    @classmethod
    def of(cls, entries: Iterable[str], machine: bool = True) -> BootstrapHosts:
        """Loopback, this machine's addresses and names (unless `machine` is False: tests),
        and `entries` (flag values, see parse_entry)."""
        names: set[str] = {"localhost"}
        addrs: set[IP] = {ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")}
        nets: list[Net] = []
        any_host = False
        if machine:
            own = _machine_names()
            names |= own
            addrs |= _machine_addresses(own)
        for raw in entries:
            e = parse_entry(raw)
            if e == "*":
                any_host = True
            elif "/" in e:
                nets.append(ipaddress.ip_network(e))
            else:
                try:
                    addrs.add(ipaddress.ip_address(e))
                except ValueError:
                    names.add(e)
                    addrs |= _resolve(e)
        return cls(frozenset(names), frozenset(addrs), tuple(nets), any_host)

    def allows(self, host: str) -> bool:
        """Whether `host` (a name or an address, as bootstrap_of validated it) is allowed."""
        if self.any_host:
            return True
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            return host.lower().rstrip(".") in self.names
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped  # ::ffff:10.0.0.1 is 10.0.0.1
        return ip in self.addresses or any(ip in n for n in self.networks)


def _machine_names() -> set[str]:
    out = set()
    for name in (socket.gethostname(), socket.getfqdn()):
        if name:
            out.add(name.lower().rstrip("."))
    return out


def _resolve(name: str) -> set[IP]:
    """The addresses `name` resolves to now (none when it does not)."""
    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return set()
    out: set[IP] = set()
    for info in infos:
        with contextlib.suppress(ValueError):
            out.add(ipaddress.ip_address(str(info[4][0]).split("%")[0]))
    return out


def _machine_addresses(names: set[str]) -> set[IP]:
    """Every address of this machine: its names' addresses, each interface's IPv4 address, and
    its IPv6 addresses (Linux: /proc/net/if_inet6)."""
    out: set[IP] = set()
    for name in names:
        out |= _resolve(name)
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, ifname in socket.if_nameindex():
            with contextlib.suppress(OSError):
                req = struct.pack("256s", ifname.encode()[:15])
                raw = fcntl.ioctl(s.fileno(), 0x8915, req)  # SIOCGIFADDR
                out.add(ipaddress.ip_address(socket.inet_ntoa(raw[20:24])))
    with contextlib.suppress(OSError, ValueError), open("/proc/net/if_inet6") as f:
        for line in f:
            hexaddr = line.split()[0]
            out.add(ipaddress.ip_address(bytes.fromhex(hexaddr)))
    return out
