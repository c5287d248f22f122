"""`POST /v1/chat/completions`: one response (`n` choices, optional logprobs), or an SSE stream with a
chunk per committed block."""

from collections.abc import AsyncIterator, Iterator

from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from .admission import ServerConfig, check_model, output_grammar, submit
from .async_engine import RequestStream
from .errors import bad_request
from .lifecycle import RequestRecord, event_stream, final_outputs, usage
from .logprobs import MAX_TOP_LOGPROBS, chat_logprobs
from .output import ChatParts, ChatView, ResponseText
from .prompts import Prompt, chat_prompt
from .runtime import Runtime
from .schemas import (AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk,
                      ChatCompletionRequest, ChatDelta, ToolCallDelta)
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
        stream, request = queued[0]
        record = RequestRecord(rt.engine.metrics, "chat", request.request_id, len(prompt.ids))
        text = ResponseText(rt.tokenizer, request.params.eos_token_id, req.stop_list())
        view = ChatView(prompt.think_opened, prompt.parse_tools)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        events = chat_events(stream, prompt, text, view, record, req.model, include_usage)
        return StreamingResponse(events, media_type="text/event-stream")
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


def _chunk(request_id: str, model: str, delta: ChatDelta, finish_reason: str | None = None) -> dict:
    chunk = ChatCompletionChunk(id=request_id, model=model, choices=[
        ChatChunkChoice(delta=delta, finish_reason=finish_reason)]).model_dump()
    chunk["choices"][0]["delta"] = delta.model_dump(exclude_none=True)
    del chunk["usage"]
    return chunk


def _tool_call_deltas(parts: ChatParts) -> list[ToolCallDelta]:
    return [ToolCallDelta(index=i, id=c.id, type="function",
                          function={"name": c.function.name, "arguments": c.function.arguments})
            for i, c in enumerate(parts.tool_calls)]


def chat_events(stream: RequestStream, prompt: Prompt, text: ResponseText, view: ChatView,
                record: RequestRecord, model: str, include_usage: bool) -> AsyncIterator[str]:
    rid = stream.request.request_id

    def render(out: RequestOutput) -> Iterator[dict]:
        final = out.finished
        d_reason, d_content, parts = view.delta(prompt.forced_prefix + text.safe(final), final)
        calls = _tool_call_deltas(parts) if final and parts.tool_calls else None
        quiet = "" if not (d_reason or calls) else None  # an empty chunk still marks the block
        delta = ChatDelta(content=d_content or quiet, reasoning_content=d_reason or None, tool_calls=calls)
        if d_content or d_reason or calls or not final:
            yield _chunk(rid, model, delta)
        if final:
            yield _chunk(rid, model, ChatDelta(), _finish_reason(parts, out.finish_reason))
            if include_usage:
                yield ChatCompletionChunk(id=rid, model=model, choices=[], usage=usage(prompt, text)).model_dump()

    def opening() -> list[dict]:
        return [_chunk(rid, model, ChatDelta(role="assistant", content=""))]

    return event_stream(stream, text, record, opening, render)
