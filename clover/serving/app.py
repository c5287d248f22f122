"""The HTTP app: thin FastAPI routes over the runtime (engine, tokenizer, defaults).

`create_app(config, load)` returns at once; `load(metrics)` builds the `Runtime` in a background
thread at startup, and until it returns `/health` and every model route answer 503 (loading).
With an API key, /v1, /tokenize, /detokenize and /metrics need it (/health does not); /docs and
/openapi.json exist only with `config.docs`.
"""

import logging
import threading
from collections.abc import Callable
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response

from .admission import ServerConfig
from .chat import create_chat_completion
from .completions import create_completion
from .errors import APIError, install_error_handlers, loading
from .metrics import ServingMetrics
from .middleware import APIKeyGuard, BodyLimit, StatusCounter
from .runtime import Runtime
from .schemas import (ChatCompletionRequest, CompletionRequest, DetokenizeRequest, DetokenizeResponse, ModelCard,
                      ModelList, TokenizeRequest, TokenizeResponse)
from .tokenize import create_detokenize, create_tokenize

log = logging.getLogger("clover.serve")


class RuntimeSlot:
    """Holds the runtime once `load` has built it (or the reason it could not)."""

    def __init__(self, load: Callable[[ServingMetrics], Runtime], metrics: ServingMetrics,
                 on_error: Callable[[str], None] | None = None):
        self.load, self.metrics, self.on_error = load, metrics, on_error
        self.runtime: Runtime | None = None
        self.error: str | None = None
        self.thread = threading.Thread(target=self._load, name="clover-load", daemon=True)

    def _load(self) -> None:
        try:
            self.runtime = self.load(self.metrics)
            log.info("model ready")
        except Exception as e:  # noqa: BLE001 - reported by /health and every route
            if isinstance(e, (OSError, ValueError)):  # a bad folder or file: one line, no traceback
                log.error("model failed to load: %s: %s", type(e).__name__, e)
            else:
                log.exception("model failed to load")
            self.error = f"{type(e).__name__}: {e}"
            if self.on_error is not None:
                self.on_error(self.error)

    def get(self) -> Runtime:
        if self.runtime is not None:
            return self.runtime
        if self.error is not None:
            raise APIError(503, "The model failed to load; see the server log.", "service_unavailable",
                           code="model_load_failed")
        raise loading()


def create_app(config: ServerConfig, load: Callable[[ServingMetrics], Runtime],
               on_load_error: Callable[[str], None] | None = None) -> FastAPI:
    """`on_load_error(message)` is called (from the loading thread) if `load` raises."""
    metrics = ServingMetrics()
    slot = RuntimeSlot(load, metrics, on_load_error)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        slot.thread.start()
        yield
        if slot.runtime is not None:
            slot.runtime.shutdown()

    docs = {} if config.docs else dict(docs_url=None, redoc_url=None, openapi_url=None)
    app = FastAPI(title="Clover OpenAI-compatible server", lifespan=lifespan, **docs)
    app.state.slot, app.state.metrics = slot, metrics
    install_error_handlers(app)
    runtime = Depends(lambda: slot.get())

    @app.get("/health")
    async def health():
        slot.get()
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus(raw: Request):
        body, content_type = metrics.render(raw.headers.get("accept", ""))
        return Response(body, headers={"Content-Type": content_type})

    @app.get("/v1/models")
    async def models(rt: Runtime = runtime) -> ModelList:
        return ModelList(data=[ModelCard(id=config.served_model_name, max_model_len=rt.max_model_len)])

    @app.post("/v1/chat/completions")
    async def chat(raw: Request, req: ChatCompletionRequest, rt: Runtime = runtime):
        return await create_chat_completion(raw, req, rt, config)

    @app.post("/v1/completions")
    async def completions(raw: Request, req: CompletionRequest, rt: Runtime = runtime):
        return await create_completion(raw, req, rt, config)

    @app.post("/tokenize")
    async def tokenize(req: TokenizeRequest, rt: Runtime = runtime) -> TokenizeResponse:
        return await create_tokenize(req, rt, config)

    @app.post("/detokenize")
    async def detokenize(req: DetokenizeRequest, rt: Runtime = runtime) -> DetokenizeResponse:
        return await create_detokenize(req, rt, config)

    app.add_middleware(BodyLimit, limit=config.max_body_bytes, timeout_s=config.body_timeout_s)
    app.add_middleware(APIKeyGuard, api_key=config.api_key)
    app.add_middleware(StatusCounter, metrics=metrics)
    return app

