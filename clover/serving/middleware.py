"""ASGI guards that run before routing: response counting, API key, body size.

They run before FastAPI parses anything, so a wrong key is a 401 even for a malformed body, and an
oversized body is refused (413) without being buffered past the limit.
"""

import hmac

from .errors import APIError, too_large, unauthorized
from .metrics import ServingMetrics

PROTECTED_PREFIX = "/v1/"


async def _send_error(scope, receive, send, error: APIError) -> None:
    await error.response()(scope, receive, send)


class StatusCounter:
    """Counts responses by status code (`clover_http_responses_total`)."""

    def __init__(self, app, metrics: ServingMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def counting_send(message):
            if message["type"] == "http.response.start":
                self.metrics.http_responses.inc(1, str(message["status"]))
            await send(message)

        await self.app(scope, receive, counting_send)


class APIKeyGuard:
    """Requires `Authorization: Bearer <key>` on /v1/ routes; compares in constant time."""

    def __init__(self, app, api_key: str | None):
        self.app = app
        self.key = api_key.encode() if api_key else None

    def _authorized(self, scope) -> bool:
        header = dict(scope.get("headers", [])).get(b"authorization", b"")
        scheme, _, token = header.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key)

    async def __call__(self, scope, receive, send):
        if (self.key is not None and scope["type"] == "http" and scope["path"].startswith(PROTECTED_PREFIX)
                and not self._authorized(scope)):
            return await _send_error(scope, receive, send, unauthorized())
        await self.app(scope, receive, send)


class BodyLimit:
    """Reads the body up front, refusing it past `limit` bytes (413); then replays it to the app
    and hands later `receive` calls (disconnect notices) to the server."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers", [])).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await _send_error(scope, receive, send, too_large(self.limit))
        chunks, size = [], 0
        while True:
            message = await receive()
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
