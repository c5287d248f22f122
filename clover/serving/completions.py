"""`POST /v1/completions`: raw-prompt text completion, one response (`n` choices, optional logprobs)
or an SSE stream of every choice's committed blocks (their logprobs with them), interleaved by `index`."""

from collections.abc import Iterator

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from .admission import ServerConfig, check_model, output_grammar, submit
from .async_engine import RequestStream
from .errors import bad_request
from .lifecycle import StreamedChoice, final_outputs, streaming_response, usage
from .logprobs import MAX_TOP_LOGPROBS, Cursor, completion_logprobs
from .prompts import Prompt, completion_prompt
from .runtime import Runtime
from .schemas import Completion, CompletionChoice, CompletionLogprobs, CompletionRequest
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
        return _stream(req, rt, prompt, queued, top, echo)
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


def _chunk(response_id: str, model: str, index: int, text: str, finish_reason: str | None = None,
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
            yield _chunk(self.response_id, self.model, self.index, self.echo,
                         logprobs=self._logprobs("", False, self.text.prompt_logprobs))
        safe = self.text.safe(out.finished)
        delta, self.sent = safe[len(self.sent):], safe
        yield _chunk(self.response_id, self.model, self.index, delta, out.finish_reason if out.finished else None,
                     self._logprobs(safe, out.finished))


def _stream(req: CompletionRequest, rt: Runtime, prompt: Prompt, queued: list, top: int | None, echo: str):
    response_id = queued[0][1].request_id
    choices = [CompletionStreamChoice(i, stream, prompt, rt, req, response_id, top, echo)
               for i, (stream, _) in enumerate(queued)]

    return streaming_response(choices, prompt, req.stream_options, lambda u: Completion(
        id=response_id, model=req.model, choices=[], usage=u).model_dump())
