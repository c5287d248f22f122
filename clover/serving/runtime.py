"""What the HTTP layer needs once the model is up: the engine over a loaded model and tokenizer, its
default decoding settings, and the engine seen from asyncio (submit a request, iterate its outputs,
abort it when abandoned)."""

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

from clover.model.generation_config import DecodeConfig, chat_token_ids, resolve_config, validate_settings

from .engine import Engine, EngineConfig
from .metrics import ServingMetrics
from .scheduler import EngineRequest, RequestOutput

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


log = logging.getLogger("clover.serve")



def server_defaults(model, tokenizer) -> DecodeConfig:
    """The model's resolved decoding defaults; EOS and think token ids the checkpoint leaves unset
    come from the tokenizer (the chat format's, SPEC §10), as `clover generate` does."""
    base = resolve_config(getattr(model, "generation_config", None), model.config, {})
    ids = chat_token_ids(tokenizer)
    return replace(base, eos_token_id=base.eos_token_id or tuple(ids["eos_token_id"]),
                   think_start_token_id=_first_set(base.think_start_token_id, ids.get("think_start_token_id")),
                   think_end_token_id=_first_set(base.think_end_token_id, ids.get("think_end_token_id")))


def _first_set(*values):
    return next((v for v in values if v is not None), None)


@dataclass
class Runtime:
    engine: Engine
    async_engine: AsyncEngine
    tokenizer: object
    defaults: DecodeConfig
    model_config: object  # the model's config: vocab_size, mask_token_id, max_position_embeddings

    @property
    def max_model_len(self) -> int:
        return self.model_config.max_position_embeddings

    @property
    def vocab_size(self) -> int:
        return self.model_config.vocab_size

    @classmethod
    def from_objects(cls, model, tokenizer, config: EngineConfig | None = None,
                     metrics: ServingMetrics | None = None, mode: str | None = None,
                     fallback: str | None = None, fill: str | None = None) -> "Runtime":
        """Start an engine over an in-memory model and tokenizer (tests, benchmarks). `mode`,
        `fallback` and `fill`: the decoding mode and block diffusion's rules of requests that name
        none (default: the checkpoint's, block diffusion)."""
        chosen = {name: value for name, value in (("mode", mode), ("fallback", fallback), ("fill", fill))
                  if value is not None}
        defaults = replace(server_defaults(model, tokenizer), **chosen)
        validate_settings(defaults, model.config.vocab_size)  # names a bad mode or rule and its choices
        engine = Engine(model, tokenizer, EngineConfig() if config is None else config, metrics).start()
        return cls(engine, AsyncEngine(engine), tokenizer, defaults, model.config)

    def shutdown(self) -> None:
        self.engine.shutdown()
