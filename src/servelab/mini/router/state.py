"""What every route of the router reads, passed to the route modules explicitly: its workers and
policy, the pickers that choose a prefill and a decode worker, its counters, and the HTTP
client session to the workers (opened when the app starts)."""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from servelab.mini.router.args import RouterConfig
from servelab.redaction import redact_text


@dataclass(slots=True)
class Counters:
    """The router's own lifetime counters, read by its /metrics."""

    requests: dict[tuple[str, int], int] = field(default_factory=dict)
    upstream_errors: dict[str, int] = field(default_factory=dict)
    in_flight: int = 0

    def done(self, path: str, status: int) -> None:
        self.requests[(path, status)] = self.requests.get((path, status), 0) + 1

    def upstream_error(self, role: str) -> None:
        self.upstream_errors[role] = self.upstream_errors.get(role, 0) + 1


class Picker:
    """The next worker index of `n` by the policy: round_robin or random."""

    def __init__(self, n: int, policy: str) -> None:
        self.n, self.policy = n, policy
        self._next = itertools.cycle(range(n))

    def __call__(self) -> int:
        return random.randrange(self.n) if self.policy == "random" else next(self._next)


@dataclass(slots=True)
class RouterState:
    """One router's workers, pickers, counters and client session."""

    cfg: RouterConfig
    counters: Counters = field(default_factory=Counters)
    pick_p: Picker = field(init=False)
    pick_d: Picker = field(init=False)
    session: aiohttp.ClientSession | None = None
    modes: dict[str, str] = field(default_factory=dict)  # worker URL -> the role it reported

    def __post_init__(self) -> None:
        self.pick_p = Picker(len(self.cfg.prefills), self.cfg.policy)
        self.pick_d = Picker(len(self.cfg.decodes), self.cfg.policy)

    @property
    def s(self) -> aiohttp.ClientSession:
        """The session to the workers (the app's startup opened it)."""
        assert self.session is not None, "the router app has not started"
        return self.session

    async def get(self, url: str, timeout_s: float = 5.0) -> tuple[int, bytes] | None:
        """(status, body) of a GET to a worker, None when it cannot be reached in time."""
        try:
            async with self.s.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                return r.status, await r.read()
        except (aiohttp.ClientError, TimeoutError, OSError):
            return None


def mode_of(got: tuple[int, bytes] | None) -> str | None:
    """The `disaggregation_mode` a worker's /server_info reports (None when it says none)."""
    if got is None or got[0] != 200:
        return None
    try:
        info = json.loads(got[1])
    except ValueError:
        return None
    mode = info.get("disaggregation_mode") if isinstance(info, dict) else None
    return mode if isinstance(mode, str) else None


async def wrong_role(state: RouterState, url: str, role: str) -> str | None:
    """Why `url` cannot serve as `role` (it reports another disaggregation mode), or None. A
    worker swapped with its peer would answer every request with one token and finish_reason
    "length"; a role once reported is remembered, one not reported is asked again next time."""
    mode = state.modes.get(url)
    if mode is None:
        mode = mode_of(await state.get(url + "/server_info", 2.0))
        if mode is not None:
            state.modes[url] = mode
    if mode is not None and mode != role:
        return f"{url} runs --disaggregation-mode {mode}, routed as {role}"
    return None


def error(status: int, message: str, kind: str = "server_error") -> web.Response:
    """An OpenAI-style JSON error answer; worker URLs in it keep no credentials."""
    return web.json_response({"error": {"message": redact_text(message), "type": kind,
                                        "param": None, "code": status}}, status=status)
