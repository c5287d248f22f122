"""`POST /v1/completions`: raw-prompt text completion, one response or an SSE stream."""

from collections.abc import AsyncIterator, Iterator

from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from .admission import ServerConfig, check_model, output_grammar, submit
from .async_engine import RequestStream
from .errors import bad_request
from .lifecycle import RequestRecord, event_stream, final_outputs, usage
from .logprobs import MAX_TOP_LOGPROBS, completion_logprobs
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
    top = _top_logprobs(req)
    prompt = await run_in_threadpool(completion_prompt, rt.tokenizer, req, rt.max_model_len)  # off the loop
    grammar = await run_in_threadpool(output_grammar, rt, req)
    queued = submit(rt, req, prompt, req.max_tokens, "cmpl", top, prompt_logprobs=req.echo and top is not None,
                    grammar=grammar)
    echo = (prompt.text or rt.tokenizer.decode(prompt.ids, skip_special_tokens=False)) if req.echo else ""
    if req.stream:
        stream, request = queued[0]
        record = RequestRecord(rt.engine.metrics, "completions", request.request_id, len(prompt.ids))
        text = ResponseText(rt.tokenizer, request.params.eos_token_id, req.stop_list())
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(completion_events(stream, prompt, text, record, req.model, include_usage, echo),
                                 media_type="text/event-stream")
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


def _top_logprobs(req: CompletionRequest) -> int | None:
    """None (no logprobs), else the alternatives per token: `logprobs` is their count (0 to 5)."""
    if req.logprobs is None or req.logprobs is False:
        return None
    if isinstance(req.logprobs, bool) or not 0 <= req.logprobs <= MAX_TOP_LOGPROBS["completions"]:
        raise bad_request(f"logprobs={req.logprobs!r} must be an integer between 0 and "
                          f"{MAX_TOP_LOGPROBS['completions']} for completions", "logprobs")
    return req.logprobs


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
