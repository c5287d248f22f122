"""From a validated request body and its prompt to a queued engine request (or an APIError)."""

from dataclasses import dataclass

import torch

from clover.model.generation_config import validate_prompt
from clover.structured import GrammarError, response_format_grammar

from .async_engine import RequestStream
from .cache_pool import CacheCapacityError
from .errors import bad_request, model_not_found, queue_full
from .params import ParamError, default_max_tokens, request_config
from .prompts import Prompt
from .runtime import Runtime
from .scheduler import QueueFullError
from .schemas import SamplingFields, new_id
from .sequence import EngineRequest


@dataclass(frozen=True)
class ServerConfig:
    served_model_name: str = "clover"
    api_key: str | None = None
    max_body_bytes: int = 4 * 1024 * 1024
    body_timeout_s: float = 30.0  # the whole body must arrive within this time after the head (408)
    docs: bool = False  # serve /docs, /redoc and /openapi.json


def check_model(name: str, config: ServerConfig) -> None:
    if name != config.served_model_name:
        raise model_not_found(name, config.served_model_name)


MAX_CHOICES = 64  # n: choices decoded for one request (each is an engine request of its own)


def refuse_unsupported(req: SamplingFields) -> None:
    if req.n > MAX_CHOICES:
        raise bad_request(f"n={req.n} is more than this server's {MAX_CHOICES} choices per request", "n")


def _overrides(req: SamplingFields, max_tokens: int | None) -> dict:
    top_k = req.top_k if req.top_k is None or req.top_k >= 0 else 0  # -1 = off, as in vLLM
    return dict(max_new_tokens=max_tokens, block_size=req.block_size, threshold=req.threshold, mode=req.mode,
                temperature=req.temperature, top_p=req.top_p, top_k=top_k,
                presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
                repetition_penalty=req.repetition_penalty)


def refuse_mode_combinations(cfg, grammar) -> None:
    """What a decoding mode cannot serve: a grammar (`response_format`) under self_spec (the draft
    is not constrained; the model package refuses it too), and self_spec with more than one
    block-mode pass per draft (the engine drafts in one)."""
    if cfg.mode == "self_spec" and grammar is not None:
        raise ParamError("response_format (json_object / json_schema) together with mode='self_spec' is not "
                         "supported: use mode 'block_diffusion' or 'ar' for structured output", "mode")
    if cfg.mode == "self_spec" and cfg.draft_steps != 1:
        raise ParamError(f"draft_steps={cfg.draft_steps} (from the checkpoint's generation config) is not "
                         "supported by the server's self_spec, which drafts in one block pass", "mode")


def output_grammar(runtime: Runtime, req: SamplingFields):
    """The compiled `response_format` grammar (None for free text); a bad one is a 400 that names
    the problem. Compiling can take a while for a large schema: call it off the event loop."""
    try:
        return response_format_grammar(runtime.tokenizer, runtime.vocab_size, req.response_format)
    except GrammarError as e:
        raise bad_request(str(e), e.param) from None


def submit(runtime: Runtime, req: SamplingFields, prompt: Prompt, max_tokens: int | None,
           prefix: str, top_logprobs: int | None = None,
           prompt_logprobs: bool = False, grammar=None) -> list[tuple[RequestStream, EngineRequest]]:
    """Resolve settings, check the prompt against the model, and queue one engine request per
    choice (`n`; choice i samples with seed + i when a seed is given). `top_logprobs`: None, or
    the alternatives reported with each token's logprob; `prompt_logprobs`: the prompt tokens' too.
    `grammar`: `output_grammar`'s; each choice decodes with its own matcher."""
    refuse_unsupported(req)
    try:
        cfg = request_config(runtime.defaults, _overrides(req, max_tokens), runtime.vocab_size)
        if max_tokens is None:  # fill the context up to the checkpoint's default budget
            budget = default_max_tokens(len(prompt.ids), cfg.block_size, runtime.max_model_len,
                                        cfg.max_new_tokens)
            cfg = request_config(cfg, {"max_new_tokens": budget or cfg.max_new_tokens}, runtime.vocab_size)
        refuse_mode_combinations(cfg, grammar)
        ids = torch.tensor([prompt.ids], dtype=torch.long).view(1, -1)
        validate_prompt(ids, torch.ones_like(ids), cfg, runtime.model_config)
        if runtime.engine.pool is not None:
            runtime.engine.pool.check(len(prompt.ids), cfg)
    except CacheCapacityError as e:
        raise bad_request(str(e), "max_tokens", "context_length_exceeded") from None
    except ParamError as e:
        raise bad_request(str(e), e.param) from None
    except ValueError as e:
        code = "context_length_exceeded" if "context" in str(e) else None
        raise bad_request(str(e), "messages" if code else None, code) from None
    first_id, queued = new_id(prefix), []
    for i in range(req.n):
        seed = None if req.seed is None else req.seed + i
        request = EngineRequest(first_id if i == 0 else f"{first_id}-{i}", prompt.ids, cfg, seed, top_logprobs,
                                prompt_logprobs, grammar)
        try:
            queued.append((runtime.async_engine.generate(request), request))
        except QueueFullError as e:
            for stream, _ in queued:
                stream.abort()
            raise queue_full(str(e)) from None
    return queued

