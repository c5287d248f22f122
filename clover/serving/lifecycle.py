"""What every generation request shares after admission: draining engine outputs with stop
strings, noticing a client that went away, SSE framing of one or several choices and its error
handling, and the one log line per engine request."""

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import aclosing

from fastapi import Request
from fastapi.responses import StreamingResponse

from .admission import Prompt
from .http_server import ClientGone, internal
from .metrics import ServingMetrics
from .output import ResponseText
from .runtime import RequestStream
from .scheduler import RequestOutput
from .schemas import Usage

log = logging.getLogger("clover.serve")

DONE = "data: [DONE]\n\n"


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def usage(prompt: Prompt, *texts: ResponseText) -> Usage:
    """Prompt tokens once; completion tokens summed over the choices."""
    n = sum(len(text.token_ids) for text in texts)
    return Usage(prompt_tokens=len(prompt.ids), completion_tokens=n, total_tokens=len(prompt.ids) + n)


async def outputs(stream: RequestStream, text: ResponseText) -> AsyncIterator[RequestOutput]:
    """Engine outputs with their tokens folded into `text`; ends at the last one, or at a stop
    string (then the engine request is aborted and the output marked finished with "stop", also
    when the stop string is only found in the last block)."""
    async for out in stream:
        text.add(out.new_token_ids, final=out.finished, logprobs=out.new_logprobs)
        if out.prompt_logprobs is not None:
            text.prompt_logprobs = out.prompt_logprobs
        if text.stopped and not out.finished:
            stream.abort()
        if text.stopped and out.finish_reason in (None, "length"):
            out.finish_reason = "stop"
        yield out
        if out.finished:
            return


async def drain(stream: RequestStream, text: ResponseText) -> RequestOutput:
    last = None
    async for out in outputs(stream, text):
        last = out
    return last


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, coro):
    """Await `coro`; raise `ClientGone` (cancelling it) if the client disconnects first."""
    task = asyncio.ensure_future(coro)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    raise ClientGone()


class RequestRecord:
    """Logs one line per request and feeds the request-level metrics, exactly once."""

    def __init__(self, metrics: ServingMetrics, endpoint: str, request_id: str, prompt_tokens: int):
        self.metrics, self.endpoint, self.request_id = metrics, endpoint, request_id
        self.prompt_tokens = prompt_tokens
        self.started = time.perf_counter()
        self.closed = False

    def close(self, completion_tokens: int, forwards: int, finish_reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        latency = time.perf_counter() - self.started
        self.metrics.requests.labels(self.endpoint, finish_reason).inc()
        self.metrics.latency.observe(latency)
        log.info("%s %s prompt_tokens=%d completion_tokens=%d forwards=%d latency=%.3fs finish=%s",
                 self.request_id, self.endpoint, self.prompt_tokens, completion_tokens, forwards, latency,
                 finish_reason)


async def final_output(raw: Request, stream: RequestStream, text: ResponseText,
                       record: RequestRecord) -> RequestOutput:
    """A non-streamed request's last output, recorded. A client that goes away first aborts the
    engine request (recorded as "abort", `ClientGone` raised); an engine failure raises a 500."""
    try:
        last = await unless_disconnected(raw, drain(stream, text))
    except ClientGone:
        stream.abort()
        record.close(len(text.token_ids), 0, "abort")
        raise
    record.close(len(text.token_ids), last.num_forwards, last.finish_reason)
    if last.error:
        raise internal()
    return last


async def final_outputs(raw: Request, queued: list, tokenizer, stop: list[str], endpoint: str, metrics,
                        prompt_tokens: int) -> tuple[list[ResponseText], list[RequestOutput]]:
    """The texts and last outputs of the `queued` (stream, request) choices of one non-streamed
    request, decoded together; one choice failing (or the client leaving) aborts them all."""
    texts = [ResponseText(tokenizer, request.params.eos_token_id, stop) for _, request in queued]
    try:
        lasts = await asyncio.gather(*(
            final_output(raw, stream, text, RequestRecord(metrics, endpoint, request.request_id, prompt_tokens))
            for (stream, request), text in zip(queued, texts)))
    finally:
        for stream, _ in queued:
            stream.abort()
    return texts, list(lasts)


class StreamedChoice:
    """One choice of a streamed request: its engine stream, its text so far, its record and its
    last output. Each endpoint says what chunks it opens with (`opening`) and what one engine
    output of it becomes (`render`), keeping whatever it has sent so far on the instance."""

    endpoint = ""  # what its record names

    def __init__(self, index: int, stream: RequestStream, tokenizer, stop: list[str], metrics: ServingMetrics,
                 prompt_tokens: int):
        request = stream.request
        self.index, self.stream = index, stream
        self.text = ResponseText(tokenizer, request.params.eos_token_id, stop)
        self.record = RequestRecord(metrics, self.endpoint, request.request_id, prompt_tokens)
        self.last: RequestOutput | None = None

    def opening(self) -> Iterable[dict]:
        return ()

    def render(self, out: RequestOutput) -> Iterable[dict]:
        raise NotImplementedError

    def close(self, failed: bool = False) -> None:
        """Abort the engine request (harmless once finished) and record it once: by its finish
        reason, else as "error" when the stream failed, else "abort" (the client left)."""
        self.stream.abort()
        last = self.last
        reason = last.finish_reason if last is not None and last.finished else ("error" if failed else "abort")
        self.record.close(len(self.text.token_ids), last.num_forwards if last else 0, reason)


async def merged_outputs(choices: list[StreamedChoice]) -> AsyncIterator[tuple[StreamedChoice, RequestOutput]]:
    """Every choice's engine outputs (folded into its text) in the order they arrive, until each
    choice has had its last one."""
    arrivals: asyncio.Queue = asyncio.Queue()

    async def pump(choice: StreamedChoice) -> None:
        try:
            async for out in outputs(choice.stream, choice.text):
                arrivals.put_nowait((choice, out, None))
        except Exception as e:  # noqa: BLE001 - raised again in the consumer
            arrivals.put_nowait((choice, None, e))

    pumps = [asyncio.ensure_future(pump(choice)) for choice in choices]
    try:
        running = len(choices)
        while running:
            choice, out, error = await arrivals.get()
            if error is not None:
                raise error
            running -= out.finished
            yield choice, out
    finally:
        for task in pumps:
            task.cancel()


async def event_stream(choices: list[StreamedChoice], closing: Callable[[], Iterable[dict]]) -> AsyncIterator[str]:
    """A streamed request's SSE events: every choice's `opening()` chunks, the `render(out)` chunks
    of each engine output as it arrives (the choices interleaved), once all have finished the
    chunks of `closing()`, then `[DONE]`. An engine error or an exception ends the stream in
    OpenAI's error shape; in every case each engine request is aborted at the end and recorded once."""
    failed = False
    try:
        for choice in choices:
            for chunk in choice.opening():
                yield sse(chunk)
        async with aclosing(merged_outputs(choices)) as merged:  # its pumps end with the stream
            async for choice, out in merged:
                choice.last = out
                if out.error:
                    yield sse({"error": internal().body()["error"]})
                    yield DONE
                    return
                for chunk in choice.render(out):
                    yield sse(chunk)
        for chunk in closing():
            yield sse(chunk)
        yield DONE
    except Exception:  # noqa: BLE001 - end the stream in OpenAI's error shape, never a traceback
        log.exception("stream of %s failed", choices[0].stream.request.request_id)
        failed = True
        yield sse({"error": internal().body()["error"]})
        yield DONE
    finally:
        for choice in choices:
            choice.close(failed)


def streaming_response(choices: list[StreamedChoice], prompt: Prompt, stream_options,
                       usage_chunk: Callable[[Usage], dict]) -> StreamingResponse:
    """The SSE response of `choices`; with `stream_options.include_usage` a last chunk,
    `usage_chunk(usage)`, with the usage of all the choices."""

    def closing() -> list[dict]:
        if not (stream_options and stream_options.include_usage):
            return []
        return [usage_chunk(usage(prompt, *(c.text for c in choices)))]

    return StreamingResponse(event_stream(choices, closing), media_type="text/event-stream")
