"""The engine seen from asyncio: submit a request, iterate its outputs, abort it when abandoned."""

import asyncio
from collections.abc import AsyncIterator

from .engine import Engine
from .sequence import EngineRequest, RequestOutput


class RequestStream:
    """Outputs of one request, delivered from the engine thread into this event loop."""

    def __init__(self, engine: Engine, request: EngineRequest):
        self.engine, self.request = engine, request
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self.finished = False

    def sink(self, output: RequestOutput) -> None:  # engine thread
        self.loop.call_soon_threadsafe(self.queue.put_nowait, output)

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        while not self.finished:
            output = await self.queue.get()
            self.finished = output.finished
            yield output

    def abort(self) -> None:
        """Stop the request (client gone, stop string found); harmless once finished."""
        if not self.finished:
            self.finished = True
            self.engine.abort(self.request.request_id)


class AsyncEngine:
    def __init__(self, engine: Engine):
        self.engine = engine

    def generate(self, request: EngineRequest) -> RequestStream:
        """Queue the request (raises `QueueFullError`) and return its output stream."""
        stream = RequestStream(self.engine, request)
        self.engine.submit(request, stream.sink)
        return stream
