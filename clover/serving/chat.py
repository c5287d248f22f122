"""`POST /v1/chat/completions`: one response, or an SSE stream with a chunk per committed block."""

import logging
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import StreamingResponse

from .admission import ServerConfig, check_model, submit
from .async_engine import RequestStream
from .errors import ClientGone, internal
from .lifecycle import DONE, RequestRecord, drain, outputs, sse, unless_disconnected, usage
from .output import ChatParts, ChatView, ResponseText
from .prompts import Prompt, chat_prompt
from .runtime import Runtime
from .schemas import (AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk,
                      ChatCompletionRequest, ChatDelta, ToolCallDelta)


log = logging.getLogger("clover.serve")


def _finish_reason(parts: ChatParts, engine_reason: str) -> str:
    return "tool_calls" if parts.tool_calls else engine_reason


async def create_chat_completion(raw: Request, req: ChatCompletionRequest, rt: Runtime, cfg: ServerConfig):
    check_model(req.model, cfg)
    prompt = chat_prompt(rt.tokenizer, req)
    stream, request = submit(rt, req, prompt, req.max_completion_tokens or req.max_tokens, "chatcmpl")
    record = RequestRecord(rt.engine.metrics, "chat", request.request_id, len(prompt.ids))
    text = ResponseText(rt.tokenizer, request.params.eos_token_id, req.stop_list())
    view = ChatView(prompt.think_opened, prompt.parse_tools)
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        events = chat_events(stream, prompt, text, view, record, req.model, include_usage)
        return StreamingResponse(events, media_type="text/event-stream")
    try:
        last = await unless_disconnected(raw, drain(stream, text))
    except ClientGone:
        stream.abort()
        record.close(len(text.token_ids), 0, "abort")
        raise
    record.close(len(text.token_ids), last.num_forwards, last.finish_reason)
    if last.error:
        raise internal()
    parts = view.parts(prompt.forced_prefix + text.text, final=True)
    message = AssistantMessage(content=parts.content if parts.content.strip() else None,
                               reasoning_content=parts.reasoning, tool_calls=parts.tool_calls or None)
    if message.content is None and not parts.tool_calls and parts.reasoning is None:
        message.content = parts.content
    choice = ChatChoice(message=message, finish_reason=_finish_reason(parts, last.finish_reason))
    return ChatCompletion(id=request.request_id, model=req.model, choices=[choice], usage=usage(prompt, text))


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


async def chat_events(stream: RequestStream, prompt: Prompt, text: ResponseText, view: ChatView,
                      record: RequestRecord, model: str, include_usage: bool) -> AsyncIterator[str]:
    rid, last = stream.request.request_id, None
    try:
        yield sse(_chunk(rid, model, ChatDelta(role="assistant", content="")))
        async for last in outputs(stream, text):
            if last.error:
                yield sse({"error": internal().body()["error"]})
                yield DONE
                return
            final = last.finished
            d_reason, d_content, parts = view.delta(prompt.forced_prefix + text.safe(final), final)
            calls = _tool_call_deltas(parts) if final and parts.tool_calls else None
            quiet = "" if not (d_reason or calls) else None  # an empty chunk still marks the block
            delta = ChatDelta(content=d_content or quiet, reasoning_content=d_reason or None, tool_calls=calls)
            if d_content or d_reason or calls or not final:
                yield sse(_chunk(rid, model, delta))
            if final:
                yield sse(_chunk(rid, model, ChatDelta(), _finish_reason(parts, last.finish_reason)))
                if include_usage:
                    yield sse(ChatCompletionChunk(id=rid, model=model, choices=[],
                                                  usage=usage(prompt, text)).model_dump())
                yield DONE
    except Exception:  # noqa: BLE001 - end the stream in OpenAI's error shape, never a traceback
        log.exception("stream of %s failed", rid)
        record.close(len(text.token_ids), last.num_forwards if last else 0, "error")
        yield sse({"error": internal().body()["error"]})
        yield DONE
    finally:
        stream.abort()
        reason = last.finish_reason if last is not None and last.finished else "abort"
        record.close(len(text.token_ids), last.num_forwards if last else 0, reason)
