"""What every generation request shares after admission: draining engine outputs with stop
strings, noticing a client that went away, SSE framing, and the one log line per request."""

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator

from fastapi import Request

from .async_engine import RequestStream
from .errors import ClientGone
from .metrics import ServingMetrics
from .output import ResponseText
from .prompts import Prompt
from .schemas import Usage
from .sequence import RequestOutput

log = logging.getLogger("clover.serve")

DONE = "data: [DONE]\n\n"


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def usage(prompt: Prompt, text: ResponseText) -> Usage:
    n = len(text.token_ids)
    return Usage(prompt_tokens=len(prompt.ids), completion_tokens=n, total_tokens=len(prompt.ids) + n)


async def outputs(stream: RequestStream, text: ResponseText) -> AsyncIterator[RequestOutput]:
    """Engine outputs with their tokens folded into `text`; ends at the last one, or at a stop
    string (then the engine request is aborted and the output marked finished with "stop")."""
    async for out in stream:
        text.add(out.new_token_ids, final=out.finished)
        if text.stopped and not out.finished:
            stream.abort()
            out.finish_reason = "stop"
        yield out
        if out.finished:
            return


async def drain(stream: RequestStream, text: ResponseText) -> RequestOutput:
    last = None
    async for out in outputs(stream, text):
        last = out
    return last


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, coro):
    """Await `coro`; raise `ClientGone` (cancelling it) if the client disconnects first."""
    task = asyncio.ensure_future(coro)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    raise ClientGone()


class RequestRecord:
    """Logs one line per request and feeds the request-level metrics, exactly once."""

    def __init__(self, metrics: ServingMetrics, endpoint: str, request_id: str, prompt_tokens: int):
        self.metrics, self.endpoint, self.request_id = metrics, endpoint, request_id
        self.prompt_tokens = prompt_tokens
        self.started = time.perf_counter()
        self.closed = False

    def close(self, completion_tokens: int, forwards: int, finish_reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        latency = time.perf_counter() - self.started
        self.metrics.requests.inc(1, self.endpoint, finish_reason)
        self.metrics.latency.observe(latency)
        log.info("%s %s prompt_tokens=%d completion_tokens=%d forwards=%d latency=%.3fs finish=%s",
                 self.request_id, self.endpoint, self.prompt_tokens, completion_tokens, forwards, latency,
                 finish_reason)
