"""`POST /v1/completions`: raw-prompt text completion, one response or an SSE stream."""

import logging
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import StreamingResponse

from .admission import ServerConfig, check_model, submit
from .async_engine import RequestStream
from .errors import ClientGone, bad_request, internal
from .lifecycle import DONE, RequestRecord, drain, outputs, sse, unless_disconnected, usage
from .output import ResponseText
from .prompts import Prompt, completion_prompt
from .runtime import Runtime
from .schemas import Completion, CompletionChoice, CompletionRequest

log = logging.getLogger("clover.serve")


async def create_completion(raw: Request, req: CompletionRequest, rt: Runtime, cfg: ServerConfig):
    check_model(req.model, cfg)
    if req.suffix:
        raise bad_request("suffix is not supported by this server", "suffix")
    if req.best_of not in (None, 1):
        raise bad_request(f"best_of={req.best_of} is not supported (only 1)", "best_of")
    prompt = completion_prompt(rt.tokenizer, req)
    stream, request = submit(rt, req, prompt, req.max_tokens, "cmpl")
    record = RequestRecord(rt.engine.metrics, "completions", request.request_id, len(prompt.ids))
    text = ResponseText(rt.tokenizer, request.params.eos_token_id, req.stop_list())
    echo = prompt.text if req.echo else ""
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(completion_events(stream, prompt, text, record, req.model, include_usage, echo),
                                 media_type="text/event-stream")
    try:
        last = await unless_disconnected(raw, drain(stream, text))
    except ClientGone:
        stream.abort()
        record.close(len(text.token_ids), 0, "abort")
        raise
    record.close(len(text.token_ids), last.num_forwards, last.finish_reason)
    if last.error:
        raise internal()
    choice = CompletionChoice(text=echo + text.text, finish_reason=last.finish_reason)
    return Completion(id=request.request_id, model=req.model, choices=[choice], usage=usage(prompt, text))


def _chunk(request_id: str, model: str, text: str, finish_reason: str | None = None) -> dict:
    chunk = Completion(id=request_id, model=model,
                       choices=[CompletionChoice(text=text, finish_reason=finish_reason)]).model_dump()
    del chunk["usage"]
    return chunk


async def completion_events(stream: RequestStream, prompt: Prompt, text: ResponseText, record: RequestRecord,
                            model: str, include_usage: bool, echo: str) -> AsyncIterator[str]:
    rid, sent, last = stream.request.request_id, "", None
    try:
        if echo:
            yield sse(_chunk(rid, model, echo))
        async for last in outputs(stream, text):
            if last.error:
                yield sse({"error": internal().body()["error"]})
                yield DONE
                return
            safe = text.safe(last.finished)
            delta, sent = safe[len(sent):], safe
            yield sse(_chunk(rid, model, delta, last.finish_reason if last.finished else None))
            if last.finished:
                if include_usage:
                    yield sse(Completion(id=rid, model=model, choices=[], usage=usage(prompt, text)).model_dump())
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
