"""The HTTP layer under the routes: the uvicorn server, the ASGI guards in front of the app, and
errors in OpenAI's shape.

The uvicorn server `clover serve` runs, with limits on what a connection may hold.

- A request head (request line and headers) must arrive within `head_timeout_s` of the connection
  opening or of the previous response (slow-header clients and idle sockets are closed); an idle
  keep-alive connection closes after `keep_alive_s`; the body's own limit is `BodyLimit`'s.
- At most `max_connections` connections are served; requests beyond get uvicorn's 503.
- SIGTERM / SIGINT drain: no new connections, running requests finish for up to
  `shutdown_timeout_s` (then they are cancelled), the engine stops, and `run()` returns, so a clean
  shutdown exits 0 (uvicorn would re-raise the signal: exit 143).

ASGI guards that run before routing: response counting, API key, body size and body time.

They run before FastAPI parses anything, so a wrong key is a 401 even for a malformed body, and an
oversized body is refused (413) without being buffered past the limit, a body that takes longer
than `timeout_s` to arrive is refused (408).

Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`, never a traceback.
"""

import asyncio
import hmac
import logging
import time
from dataclasses import dataclass

import h11
import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from uvicorn.protocols.http.h11_impl import H11Protocol

from .metrics import ServingMetrics

log = logging.getLogger("clover.serve")


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


class ClientGone(Exception):
    """The client disconnected before its response was complete (nobody reads the reply)."""


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def unauthorized() -> APIError:
    return APIError(401, "Invalid or missing API key. Pass it as 'Authorization: Bearer <key>'.",
                    "authentication_error", code="invalid_api_key")


def model_not_found(name: str, served: str) -> APIError:
    return APIError(404, f"The model '{name}' does not exist. This server serves '{served}'.",
                    param="model", code="model_not_found")


def too_large(limit: int) -> APIError:
    return APIError(413, f"The request body exceeds the limit of {limit} bytes.", code="request_too_large")


def body_timeout(seconds: float) -> APIError:
    return APIError(408, f"The request body did not arrive within {seconds:g} s.", code="request_timeout",
                    headers={"Connection": "close"})


def queue_full(message: str, retry_after_s: int = 1) -> APIError:
    return APIError(429, f"The server is at capacity: {message}. Retry later.", "rate_limit_error",
                    code="queue_full", headers={"Retry-After": str(retry_after_s)})


def loading() -> APIError:
    return APIError(503, "The model is still loading. Retry shortly.", "service_unavailable",
                    code="model_loading", headers={"Retry-After": "5"})


def internal(message: str = "The server failed while handling this request.") -> APIError:
    return APIError(500, message, "server_error", code="internal_error")


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "Invalid request.", None
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid":
        return "The request body is not valid JSON.", None
    param = ".".join(loc) or None
    where = f" at '{param}'" if param else ""
    return f"Invalid request{where}: {first.get('msg', 'invalid value')}.", param


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        log.info("refused %s %s: %d %s", request.method, request.url.path, exc.status, exc.code or exc.type)
        return exc.response()

    @app.exception_handler(ClientGone)
    async def _gone(request: Request, exc: ClientGone):
        return Response(status_code=499)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        message, param = _validation_message(exc)
        log.info("refused %s %s: 400 %s", request.method, request.url.path, message)
        return bad_request(message, param).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        type_ = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return APIError(exc.status_code, str(exc.detail), type_).response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return internal().response()


PROTECTED_PREFIXES = ("/v1/", "/metrics", "/tokenize", "/detokenize")


async def _send_error(scope, receive, send, error: APIError) -> None:
    await error.response()(scope, receive, send)


class StatusCounter:
    """Counts responses by status code (`clover_http_responses_total`)."""

    def __init__(self, app, metrics: ServingMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def counting_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                self.metrics.http_responses.labels(str(message["status"])).inc()
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        except Exception:
            if not started:  # the outermost (Starlette) layer answers it with a 500
                self.metrics.http_responses.labels("500").inc()
            raise


class APIKeyGuard:
    """Requires `Authorization: Bearer <key>` on /v1/ routes, /tokenize, /detokenize and /metrics;
    compares in constant time."""

    def __init__(self, app, api_key: str | None):
        self.app = app
        self.key = api_key.encode() if api_key else None

    def _authorized(self, scope) -> bool:
        header = dict(scope.get("headers", [])).get(b"authorization", b"")
        scheme, _, token = header.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key)

    async def __call__(self, scope, receive, send):
        if (self.key is not None and scope["type"] == "http" and scope["path"].startswith(PROTECTED_PREFIXES)
                and not self._authorized(scope)):
            return await _send_error(scope, receive, send, unauthorized())
        await self.app(scope, receive, send)


class BodyLimit:
    """Reads the body up front, refusing it past `limit` bytes (413) or when it has not all arrived
    `timeout_s` after the request head (408); then replays it to the app and hands later `receive`
    calls (disconnect notices) to the server."""

    def __init__(self, app, limit: int, timeout_s: float = 30.0):
        self.app, self.limit, self.timeout_s = app, limit, timeout_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers", [])).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await _send_error(scope, receive, send, too_large(self.limit))
        chunks, size, deadline = [], 0, time.monotonic() + self.timeout_s
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                return await _send_error(scope, receive, send, body_timeout(self.timeout_s))
            if message["type"] != "http.request":
                return  # the client left before sending its body
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                return await _send_error(scope, receive, send, too_large(self.limit))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


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
