"""ASGI guards that run before routing: response counting, API key, body size and body time.

They run before FastAPI parses anything, so a wrong key is a 401 even for a malformed body, and an
oversized body is refused (413) without being buffered past the limit, a body that takes longer
than `timeout_s` to arrive is refused (408).
"""

import asyncio
import hmac
import time

from .errors import APIError, body_timeout, too_large, unauthorized
from .metrics import ServingMetrics

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
