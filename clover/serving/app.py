"""The routes: thin FastAPI handlers over the runtime (engine, tokenizer, defaults), one per endpoint.

`create_app(config, load)` returns at once; `load(metrics)` builds the `Runtime` in a background
thread at startup, and until it returns `/health` and every model route answer 503 (loading).
With an API key, /v1, /tokenize, /detokenize and /metrics need it (/health does not); /docs and
/openapi.json exist only with `config.docs`.

`POST /v1/chat/completions`: one response (`n` choices, optional logprobs), or an SSE stream with a
chunk per committed block of each choice (its logprobs with it), the choices interleaved by `index`.

`POST /v1/completions`: raw-prompt text completion, one response (`n` choices, optional logprobs)
or an SSE stream of every choice's committed blocks (their logprobs with them), interleaved by `index`.

`POST /tokenize` and `POST /detokenize`, as vLLM serves them.

/tokenize takes a `prompt` (tokenized as is) or chat `messages` (rendered with the chat template,
exactly as chat completions render them, then tokenized) and answers `tokens`, `count` and
`max_model_len` (and `token_strs` with `return_token_strs`). /detokenize takes `tokens` and
answers their text (`prompt`), special tokens kept. Both check `model` when one is given.
"""

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from .admission import (Prompt, ServerConfig, chat_prompt, check_model, completion_prompt, output_grammar, submit,
                        text_ids)
from .http_server import APIError, APIKeyGuard, BodyLimit, StatusCounter, bad_request, install_error_handlers, loading
from .lifecycle import StreamedChoice, final_outputs, streaming_response, usage
from .metrics import ServingMetrics
from .output import MAX_TOP_LOGPROBS, ChatParts, ChatView, Cursor, ResponseText, chat_logprobs, completion_logprobs
from .runtime import RequestStream, Runtime
from .scheduler import RequestOutput
from .schemas import (AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk,
                      ChatCompletionRequest, ChatDelta, ChatLogprobs, Completion, CompletionChoice, CompletionLogprobs,
                      CompletionRequest, DetokenizeRequest, DetokenizeResponse, ModelCard, ModelList, TokenizeRequest,
                      TokenizeResponse, ToolCallDelta)

def _finish_reason(parts: ChatParts, engine_reason: str) -> str:
    return "tool_calls" if parts.tool_calls else engine_reason


def _refuse_grammar_conflicts(prompt: Prompt) -> None:
    """The grammar constrains the whole response, so it cannot start inside <think> or a forced tool call."""
    if prompt.think_opened:
        raise bad_request("response_format with thinking on is not supported: the response would start "
                          "inside <think>; send enable_thinking=false", "response_format")
    if prompt.forced_prefix:
        raise bad_request("response_format together with a forced tool call (tool_choice) is not supported",
                          "response_format")


def _chat_top_logprobs(req: ChatCompletionRequest) -> int | None:
    """None (no logprobs), else the alternatives per token (`top_logprobs`, 0 when absent)."""
    if req.top_logprobs is not None and not 0 <= req.top_logprobs <= MAX_TOP_LOGPROBS["chat"]:
        raise bad_request(f"top_logprobs={req.top_logprobs} must be between 0 and {MAX_TOP_LOGPROBS['chat']}",
                          "top_logprobs")
    if not isinstance(req.logprobs, (bool, type(None))):
        raise bad_request(f"logprobs={req.logprobs!r} must be true or false for chat completions", "logprobs")
    if not req.logprobs:
        if req.top_logprobs:
            raise bad_request("top_logprobs needs logprobs=true", "top_logprobs")
        return None
    return req.top_logprobs or 0


async def create_chat_completion(raw: Request, req: ChatCompletionRequest, rt: Runtime, cfg: ServerConfig):
    check_model(req.model, cfg)
    top = _chat_top_logprobs(req)
    prompt = await run_in_threadpool(chat_prompt, rt.tokenizer, req, rt.max_model_len)  # off the loop
    grammar = await run_in_threadpool(output_grammar, rt, req)
    if grammar is not None:
        _refuse_grammar_conflicts(prompt)
    queued = submit(rt, req, prompt, req.max_completion_tokens or req.max_tokens, "chatcmpl", top,
                    grammar=grammar)
    if req.stream:
        return _chat_stream(req, rt, prompt, queued, top)
    texts, lasts = await final_outputs(raw, queued, rt.tokenizer, req.stop_list(), "chat", rt.engine.metrics,
                                       len(prompt.ids))
    choices = [_choice(i, prompt, text, last, rt.tokenizer, top) for i, (text, last) in enumerate(zip(texts, lasts))]
    return ChatCompletion(id=queued[0][1].request_id, model=req.model, choices=choices,
                          usage=usage(prompt, *texts))


def _choice(index: int, prompt: Prompt, text: ResponseText, last: RequestOutput, tokenizer,
            top: int | None) -> ChatChoice:
    view = ChatView(prompt.think_opened, prompt.parse_tools)
    parts = view.parts(prompt.forced_prefix + text.text, final=True)
    message = AssistantMessage(content=parts.content if parts.content.strip() else None,
                               reasoning_content=parts.reasoning, tool_calls=parts.tool_calls or None)
    if message.content is None and not parts.tool_calls and parts.reasoning is None:
        message.content = parts.content
    logprobs = None if top is None else chat_logprobs(tokenizer, text.token_ids, text.logprobs, text.eos_ids,
                                                      text.text, top)
    return ChatChoice(index=index, message=message, finish_reason=_finish_reason(parts, last.finish_reason),
                      logprobs=logprobs)


def _chat_chunk(response_id: str, model: str, index: int, delta: ChatDelta, finish_reason: str | None = None,
                logprobs: ChatLogprobs | None = None) -> dict:
    chunk = ChatCompletionChunk(id=response_id, model=model, choices=[
        ChatChunkChoice(index=index, delta=delta, finish_reason=finish_reason, logprobs=logprobs)]).model_dump()
    chunk["choices"][0]["delta"] = delta.model_dump(exclude_none=True)
    del chunk["usage"]
    return chunk


def _tool_call_deltas(parts: ChatParts) -> list[ToolCallDelta]:
    return [ToolCallDelta(index=i, id=c.id, type="function",
                          function={"name": c.function.name, "arguments": c.function.arguments})
            for i, c in enumerate(parts.tool_calls)]


class ChatStreamChoice(StreamedChoice):
    """One streamed chat choice: a role chunk, then per committed block a delta (reasoning, content,
    and tool calls once final) with the logprobs of the tokens it carries, then a finish chunk."""

    endpoint = "chat"

    def __init__(self, index: int, stream: RequestStream, prompt: Prompt, rt: Runtime,
                 req: ChatCompletionRequest, response_id: str, top: int | None):
        super().__init__(index, stream, rt.tokenizer, req.stop_list(), rt.engine.metrics, len(prompt.ids))
        self.prompt, self.tokenizer, self.top = prompt, rt.tokenizer, top
        self.response_id, self.model = response_id, req.model
        self.view = ChatView(prompt.think_opened, prompt.parse_tools)
        self.cursor = Cursor()

    def _chunk(self, delta: ChatDelta, finish_reason: str | None = None, logprobs: ChatLogprobs | None = None):
        return _chat_chunk(self.response_id, self.model, self.index, delta, finish_reason, logprobs)

    def opening(self) -> list[dict]:
        return [self._chunk(ChatDelta(role="assistant", content=""))]

    def render(self, out: RequestOutput) -> Iterator[dict]:
        final, text = out.finished, self.text
        safe = text.safe(final)
        d_reason, d_content, parts = self.view.delta(self.prompt.forced_prefix + safe, final)
        calls = _tool_call_deltas(parts) if final and parts.tool_calls else None
        logprobs = None if self.top is None else chat_logprobs(self.tokenizer, text.token_ids, text.logprobs,
                                                               text.eos_ids, safe, self.top, self.cursor)
        quiet = "" if not (d_reason or calls) else None  # an empty chunk still marks the block
        delta = ChatDelta(content=d_content or quiet, reasoning_content=d_reason or None, tool_calls=calls)
        if d_content or d_reason or calls or not final or (logprobs is not None and logprobs.content):
            yield self._chunk(delta, logprobs=logprobs)
        if final:
            yield self._chunk(ChatDelta(), _finish_reason(parts, out.finish_reason))


def _chat_stream(req: ChatCompletionRequest, rt: Runtime, prompt: Prompt, queued: list, top: int | None):
    response_id = queued[0][1].request_id
    choices = [ChatStreamChoice(i, stream, prompt, rt, req, response_id, top) for i, (stream, _) in enumerate(queued)]

    return streaming_response(choices, prompt, req.stream_options, lambda u: ChatCompletionChunk(
        id=response_id, model=req.model, choices=[], usage=u).model_dump())


async def create_completion(raw: Request, req: CompletionRequest, rt: Runtime, cfg: ServerConfig):
    check_model(req.model, cfg)
    if req.suffix:
        raise bad_request("suffix is not supported by this server", "suffix")
    if req.best_of not in (None, 1):
        raise bad_request(f"best_of={req.best_of} is not supported (only 1): ranking candidates needs each "
                          "one's sequence likelihood, which block diffusion does not produce; ask for n "
                          "choices instead", "best_of")
    top = _completion_top_logprobs(req)
    prompt = await run_in_threadpool(completion_prompt, rt.tokenizer, req, rt.max_model_len)  # off the loop
    grammar = await run_in_threadpool(output_grammar, rt, req)
    queued = submit(rt, req, prompt, req.max_tokens, "cmpl", top, prompt_logprobs=req.echo and top is not None,
                    grammar=grammar)
    echo = (prompt.text or rt.tokenizer.decode(prompt.ids, skip_special_tokens=False)) if req.echo else ""
    if req.stream:
        return _completion_stream(req, rt, prompt, queued, top, echo)
    texts, lasts = await final_outputs(raw, queued, rt.tokenizer, req.stop_list(), "completions", rt.engine.metrics,
                                       len(prompt.ids))
    choices = []
    for i, (text, last) in enumerate(zip(texts, lasts)):
        logprobs = None if top is None else completion_logprobs(rt.tokenizer, text.token_ids, text.logprobs,
                                                                text.eos_ids, text.text, top, echo, prompt.ids,
                                                                text.prompt_logprobs)
        choices.append(CompletionChoice(index=i, text=echo + text.text, finish_reason=last.finish_reason,
                                        logprobs=logprobs))
    return Completion(id=queued[0][1].request_id, model=req.model, choices=choices, usage=usage(prompt, *texts))


def _completion_top_logprobs(req: CompletionRequest) -> int | None:
    """None (no logprobs), else the alternatives per token: `logprobs` is their count (0 to 5)."""
    if req.logprobs is None or req.logprobs is False:
        return None
    if isinstance(req.logprobs, bool) or not 0 <= req.logprobs <= MAX_TOP_LOGPROBS["completions"]:
        raise bad_request(f"logprobs={req.logprobs!r} must be an integer between 0 and "
                          f"{MAX_TOP_LOGPROBS['completions']} for completions", "logprobs")
    return req.logprobs


def _completion_chunk(response_id: str, model: str, index: int, text: str, finish_reason: str | None = None,
                      logprobs: CompletionLogprobs | None = None) -> dict:
    chunk = Completion(id=response_id, model=model, choices=[
        CompletionChoice(index=index, text=text, finish_reason=finish_reason, logprobs=logprobs)]).model_dump()
    del chunk["usage"]
    return chunk


class CompletionStreamChoice(StreamedChoice):
    """One streamed completion choice: with its first block the `echo`ed prompt (and the prompt's
    logprobs, when asked), then per committed block its new text with the logprobs of its tokens."""

    endpoint = "completions"

    def __init__(self, index: int, stream: RequestStream, prompt: Prompt, rt: Runtime,
                 req: CompletionRequest, response_id: str, top: int | None, echo: str):
        super().__init__(index, stream, rt.tokenizer, req.stop_list(), rt.engine.metrics, len(prompt.ids))
        self.prompt, self.tokenizer, self.top, self.echo = prompt, rt.tokenizer, top, echo
        self.response_id, self.model = response_id, req.model
        self.sent, self.cursor, self.echoed = "", Cursor(), False

    def _logprobs(self, text: str, final: bool, prompt_logprobs: list | None = None) -> CompletionLogprobs | None:
        """Those of the response tokens that start in `text` past the cursor (none with text ""),
        after those of the prompt when `prompt_logprobs` are given."""
        if self.top is None:
            return None
        t = self.text
        return completion_logprobs(self.tokenizer, t.token_ids, t.logprobs, t.eos_ids, text, self.top, self.echo,
                                   self.prompt.ids, prompt_logprobs, self.cursor, final)

    def render(self, out: RequestOutput) -> Iterator[dict]:
        if self.echo and not self.echoed:  # the prompt's logprobs come with the first output
            self.echoed = True
            yield _completion_chunk(self.response_id, self.model, self.index, self.echo,
                                    logprobs=self._logprobs("", False, self.text.prompt_logprobs))
        safe = self.text.safe(out.finished)
        delta, self.sent = safe[len(self.sent):], safe
        yield _completion_chunk(self.response_id, self.model, self.index, delta,
                                out.finish_reason if out.finished else None, self._logprobs(safe, out.finished))


def _completion_stream(req: CompletionRequest, rt: Runtime, prompt: Prompt, queued: list, top: int | None, echo: str):
    response_id = queued[0][1].request_id
    choices = [CompletionStreamChoice(i, stream, prompt, rt, req, response_id, top, echo)
               for i, (stream, _) in enumerate(queued)]

    return streaming_response(choices, prompt, req.stream_options, lambda u: Completion(
        id=response_id, model=req.model, choices=[], usage=u).model_dump())


def tokenize_ids(tokenizer, req: TokenizeRequest, max_model_len: int) -> list[int]:
    if req.messages is not None:
        prompt = chat_prompt(tokenizer, req, max_model_len, req.add_generation_prompt, req.continue_final_message)
        if not req.add_special_tokens:
            return prompt.ids
        return tokenizer.encode(prompt.text, add_special_tokens=True)
    return text_ids(tokenizer, req.prompt, max_model_len, req.add_special_tokens is not False)


async def create_tokenize(req: TokenizeRequest, rt: Runtime, cfg: ServerConfig) -> TokenizeResponse:
    if req.model is not None:
        check_model(req.model, cfg)
    ids = await run_in_threadpool(tokenize_ids, rt.tokenizer, req, rt.max_model_len)  # off the loop
    strs = rt.tokenizer.convert_ids_to_tokens(ids) if req.return_token_strs else None
    return TokenizeResponse(count=len(ids), max_model_len=rt.max_model_len, tokens=ids, token_strs=strs)


def check_token_ids(ids: list[int], vocab_size: int, param: str = "tokens") -> None:
    """Refuse the first id outside the vocabulary, naming it, its place and the vocabulary size."""
    for i, token_id in enumerate(ids):
        if not 0 <= token_id < vocab_size:
            raise bad_request(f"'{param}.{i}' is {token_id}, which is not a token id of this model: ids go "
                              f"from 0 to {vocab_size - 1} (vocabulary size {vocab_size})", f"{param}.{i}")


async def create_detokenize(req: DetokenizeRequest, rt: Runtime, cfg: ServerConfig) -> DetokenizeResponse:
    if req.model is not None:
        check_model(req.model, cfg)
    check_token_ids(req.tokens, rt.vocab_size)
    text = await run_in_threadpool(rt.tokenizer.decode, req.tokens, skip_special_tokens=False)
    return DetokenizeResponse(prompt=text)


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
