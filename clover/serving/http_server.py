"""The uvicorn server `clover serve` runs, with limits on what a connection may hold.

- A request head (request line and headers) must arrive within `head_timeout_s` of the connection
  opening or of the previous response (slow-header clients and idle sockets are closed); an idle
  keep-alive connection closes after `keep_alive_s`; the body's own limit is `BodyLimit`'s.
- At most `max_connections` connections are served; requests beyond get uvicorn's 503.
- SIGTERM / SIGINT drain: no new connections, running requests finish for up to
  `shutdown_timeout_s` (then they are cancelled), the engine stops, and `run()` returns, so a clean
  shutdown exits 0 (uvicorn would re-raise the signal: exit 143).
"""

import asyncio
from dataclasses import dataclass

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol


@dataclass(frozen=True)
class ConnectionLimits:
    head_timeout_s: float = 10.0
    keep_alive_s: int = 5
    max_connections: int = 1024
    shutdown_timeout_s: int = 30


class HeadTimeoutProtocol(H11Protocol):
    """h11 with a deadline for each request head (uvicorn has none: a client sending one header
    byte a minute, or nothing at all, would hold its socket forever)."""

    head_timeout_s = ConnectionLimits.head_timeout_s

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        self._arm_head_timer()

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if getattr(self, "_head_timer", None) is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()  # no complete request head in time

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._cancel_head_timer()  # the head is in; the body's time is BodyLimit's

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)


class Server(uvicorn.Server):
    """uvicorn's server, but a signal that asked for a graceful shutdown is not re-raised after it."""

    def handle_exit(self, sig, frame) -> None:
        super().handle_exit(sig, frame)
        self._captured_signals.clear()


def server_config(app, host: str, port: int, limits: ConnectionLimits = ConnectionLimits(),
                  log_level: str = "info", access_log: bool = False) -> uvicorn.Config:
    protocol = type("HeadTimeoutProtocol", (HeadTimeoutProtocol,), {"head_timeout_s": limits.head_timeout_s})
    return uvicorn.Config(app, host=host, port=port, http=protocol, log_level=log_level, access_log=access_log,
                          timeout_keep_alive=limits.keep_alive_s, limit_concurrency=limits.max_connections,
                          timeout_graceful_shutdown=limits.shutdown_timeout_s)
