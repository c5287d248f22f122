"""`POST /v1/completions`: raw-prompt text completion, one response or an SSE stream."""

from collections.abc import AsyncIterator, Iterator

from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from .admission import ServerConfig, check_model, submit
from .async_engine import RequestStream
from .errors import bad_request
from .lifecycle import RequestRecord, event_stream, final_output, usage
from .output import ResponseText
from .prompts import Prompt, completion_prompt
from .runtime import Runtime
from .schemas import Completion, CompletionChoice, CompletionRequest
from .sequence import RequestOutput


async def create_completion(raw: Request, req: CompletionRequest, rt: Runtime, cfg: ServerConfig):
    check_model(req.model, cfg)
    if req.suffix:
        raise bad_request("suffix is not supported by this server", "suffix")
    if req.best_of not in (None, 1):
        raise bad_request(f"best_of={req.best_of} is not supported (only 1)", "best_of")
    prompt = await run_in_threadpool(completion_prompt, rt.tokenizer, req, rt.max_model_len)  # off the loop
    stream, request = submit(rt, req, prompt, req.max_tokens, "cmpl")
    record = RequestRecord(rt.engine.metrics, "completions", request.request_id, len(prompt.ids))
    text = ResponseText(rt.tokenizer, request.params.eos_token_id, req.stop_list())
    echo = prompt.text if req.echo else ""
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(completion_events(stream, prompt, text, record, req.model, include_usage, echo),
                                 media_type="text/event-stream")
    last = await final_output(raw, stream, text, record)
    choice = CompletionChoice(text=echo + text.text, finish_reason=last.finish_reason)
    return Completion(id=request.request_id, model=req.model, choices=[choice], usage=usage(prompt, text))


def _chunk(request_id: str, model: str, text: str, finish_reason: str | None = None) -> dict:
    chunk = Completion(id=request_id, model=model,
                       choices=[CompletionChoice(text=text, finish_reason=finish_reason)]).model_dump()
    del chunk["usage"]
    return chunk


def completion_events(stream: RequestStream, prompt: Prompt, text: ResponseText, record: RequestRecord,
                      model: str, include_usage: bool, echo: str) -> AsyncIterator[str]:
    rid, sent = stream.request.request_id, ""

    def render(out: RequestOutput) -> Iterator[dict]:
        nonlocal sent
        safe = text.safe(out.finished)
        delta, sent = safe[len(sent):], safe
        yield _chunk(rid, model, delta, out.finish_reason if out.finished else None)
        if out.finished and include_usage:
            yield Completion(id=rid, model=model, choices=[], usage=usage(prompt, text)).model_dump()

    return event_stream(stream, text, record, lambda: [_chunk(rid, model, echo)] if echo else [], render)
