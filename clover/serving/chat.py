"""`POST /v1/chat/completions`: one response (`n` choices, optional logprobs), or an SSE stream with a
chunk per committed block of each choice (its logprobs with it), the choices interleaved by `index`."""

from collections.abc import Iterator

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from .admission import ServerConfig, check_model, output_grammar, submit
from .async_engine import RequestStream
from .errors import bad_request
from .lifecycle import StreamedChoice, final_outputs, streaming_response, usage
from .logprobs import MAX_TOP_LOGPROBS, Cursor, chat_logprobs
from .output import ChatParts, ChatView, ResponseText
from .prompts import Prompt, chat_prompt
from .runtime import Runtime
from .schemas import (AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk,
                      ChatCompletionRequest, ChatDelta, ChatLogprobs, ToolCallDelta)
from .sequence import RequestOutput


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


def _top_logprobs(req: ChatCompletionRequest) -> int | None:
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
    top = _top_logprobs(req)
    prompt = await run_in_threadpool(chat_prompt, rt.tokenizer, req, rt.max_model_len)  # off the loop
    grammar = await run_in_threadpool(output_grammar, rt, req)
    if grammar is not None:
        _refuse_grammar_conflicts(prompt)
    queued = submit(rt, req, prompt, req.max_completion_tokens or req.max_tokens, "chatcmpl", top,
                    grammar=grammar)
    if req.stream:
        return _stream(req, rt, prompt, queued, top)
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


def _chunk(response_id: str, model: str, index: int, delta: ChatDelta, finish_reason: str | None = None,
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
        return _chunk(self.response_id, self.model, self.index, delta, finish_reason, logprobs)

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


def _stream(req: ChatCompletionRequest, rt: Runtime, prompt: Prompt, queued: list, top: int | None):
    response_id = queued[0][1].request_id
    choices = [ChatStreamChoice(i, stream, prompt, rt, req, response_id, top) for i, (stream, _) in enumerate(queued)]

    return streaming_response(choices, prompt, req.stream_options, lambda u: ChatCompletionChunk(
        id=response_id, model=req.model, choices=[], usage=u).model_dump())
