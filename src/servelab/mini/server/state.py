"""What every route of one server reads, passed to the route modules explicitly: the engine, the
served model's name, the flags /server_info reports, and the server's PD role."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fastapi import Request

from servelab.mini.engine.engine import Engine
from servelab.mini.server.http import EngineStream, until_gone
from servelab.mini.server.pd.role import PD
from servelab.mini.server.protocol import ApiError


@dataclass(frozen=True, slots=True)
class ServerState:
    """One server's engine and how it presents itself."""

    engine: Engine
    model_name: str
    server_args: dict
    pd: PD

    @property
    def names(self) -> set[str]:
        """The model names a request may ask for: the served name, the config's name."""
        return {self.model_name, self.engine.cfg.name}

    def check_model(self, body: dict) -> None:
        """A request's `model`, if it names one, must be this server's (404 otherwise)."""
        m = body.get("model")
        if m is not None and not isinstance(m, str):
            raise ApiError(400, f"'model' must be a string, got {type(m).__name__}",
                           param="model")
        if m is not None and m not in self.names:
            raise ApiError(404, f"model {m!r} does not exist; this server serves "
                                f"{self.model_name!r}", "model_not_found")

    async def open_stream(self, request: Request, body: dict, parse_body: Callable[[], tuple]
                          ) -> tuple[EngineStream, tuple]:
        """Parse a generation request and submit it, through the server's PD role: a prefill
        server records a refusal in the request's room, a decode server waits for its KV (the
        wait ends if the client goes away)."""
        pd = self.pd
        boot = pd.room(body)
        try:
            parsed = parse_body()
            client = request.client.host if request.client else ""
            kw = pd.submit_kwargs(boot, parsed[0], client)
            kw = await (until_gone(request, kw) if pd.mode == "decode" else kw)
            return EngineStream(self.engine, parsed[0], parsed[1],
                                on_error=lambda why: pd.failed(boot, why), **kw), parsed
        except ApiError as exc:
            pd.failed(boot, exc.message)
            raise
