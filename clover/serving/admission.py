"""Request parsing and validation: from a validated request body to its prompt, its decoding settings
and a queued engine request, or an `APIError` that says what is wrong.

Requests -> prompt token ids: the chat template for chat completions, raw text for completions.

`tool_choice`: "none" hides the tools and parses nothing; "auto" (the default with tools) lets the
model decide; "required" and a named function open the call in the prompt (`<tool_call>\n` and
`{"name": ..., "arguments": `), and that forced prefix is put back in front of the response
before parsing.

Both run off the event loop (the handlers call them in a worker thread). A prompt is refused by its
UTF-8 size before it is rendered or tokenized when it cannot fit the context whatever it holds:
`max_prompt_bytes` = context tokens x the most bytes one vocabulary entry spells x
NORMALIZATION_SLACK (a normalizer such as NFC may shrink the text before it is split: at most 3x).
The client cannot bring its own chat template: `chat_template_kwargs` only sets template
variables, never an argument of `apply_chat_template` (`chat_template`, `tools`, ...).

Per-request decoding settings: the model's `DecodeConfig` plus OpenAI's request semantics.

Resolution and validation are `clover.model.generation_config`'s (request > checkpoint
`generation_config.json` > SPEC defaults); this module only maps OpenAI fields onto them.
"""

import inspect
import json
from dataclasses import dataclass, replace

import torch

from clover.model.generation_config import DecodeConfig, validate_prompt, validate_settings
from clover.structured import GrammarError, response_format_grammar

from .cache import CacheCapacityError
from .http_server import bad_request, model_not_found, queue_full
from .output import CALL_START, think_opened
from .runtime import RequestStream, Runtime
from .scheduler import EngineRequest, QueueFullError
from .schemas import ChatMessage, ChatPromptFields, CompletionRequest, NamedToolChoice, SamplingFields, new_id

REQUEST_NAMES = {"max_new_tokens": "max_tokens"}  # DecodeConfig field -> OpenAI request field


class ParamError(ValueError):
    """An invalid request parameter; `param` names it (OpenAI's `error.param`)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def request_config(base: DecodeConfig, overrides: dict, vocab_size: int) -> DecodeConfig:
    """Overlay a request's non-None settings on `base`, then validate.

    OpenAI's `temperature` also switches sampling: > 0 samples, 0 is greedy; without one the
    checkpoint's `do_sample` decides."""
    settings = {k: v for k, v in overrides.items() if v is not None}
    temperature = settings.get("temperature")
    if temperature is not None:
        settings["do_sample"] = temperature > 0
        if temperature == 0:
            settings["temperature"] = base.temperature
    cfg = replace(base, **settings)
    try:
        validate_settings(cfg, vocab_size)
    except ValueError as e:
        name = str(e).split("=", 1)[0]
        raise ParamError(str(e), REQUEST_NAMES.get(name, name)) from e
    return cfg


def default_max_tokens(prompt_len: int, block_size: int, max_positions: int, cap: int) -> int:
    """The largest whole-block budget that fits the context, at most `cap` (0 if none fits)."""
    room = (max_positions - prompt_len) // block_size * block_size
    return max(0, min(cap, room))


NORMALIZATION_SLACK = 4
_max_token_bytes: dict[int, int] = {}  # id(tokenizer) -> longest vocabulary entry in UTF-8 bytes


@dataclass
class Prompt:
    ids: list[int]
    text: str
    think_opened: bool = False  # the response starts inside <think>
    parse_tools: bool = False
    forced_prefix: str = ""  # response text the prompt already holds (a forced tool call)


def max_prompt_bytes(tokenizer, max_model_len: int) -> int:
    """The UTF-8 size past which a text cannot tokenize into `max_model_len` tokens or fewer."""
    key = id(tokenizer)
    if key not in _max_token_bytes:
        entries = list(tokenizer.get_vocab()) + [str(t) for t in getattr(tokenizer, "all_special_tokens", [])]
        _max_token_bytes[key] = max((len(t.encode("utf-8", "replace")) for t in entries), default=1)
    return max_model_len * max(1, _max_token_bytes[key]) * NORMALIZATION_SLACK


def _check_size(nbytes: int, limit: int, param: str) -> None:
    if nbytes > limit:
        raise bad_request(f"the prompt is {nbytes} bytes: it cannot fit the model's context (at most "
                          f"{limit} bytes can), so it was not tokenized", param, "context_length_exceeded")


def _content_bytes(m: ChatMessage) -> int:
    if isinstance(m.content, str):
        return len(m.content.encode("utf-8"))
    return sum(len((p.text or "").encode("utf-8")) for p in m.content or [])


def _check_parts(req: ChatPromptFields) -> None:
    for i, m in enumerate(req.messages):
        for j, part in enumerate(m.content if isinstance(m.content, list) else []):
            where = f"messages.{i}.content.{j}"
            if part.type != "text":
                raise bad_request(f"'{where}.type' is {part.type!r}: only 'text' content parts are supported "
                                  "by this model (no images, audio or files)", f"{where}.type")
            if part.text is None:
                raise bad_request(f"'{where}' is a text part without 'text'", f"{where}.text")


def _template_parameters(tokenizer) -> set[str]:
    signature = inspect.signature(tokenizer.apply_chat_template)
    return {n for n, p in signature.parameters.items() if p.kind is not p.VAR_KEYWORD}


def _template_kwargs(tokenizer, req: ChatPromptFields) -> dict:
    kwargs = dict(req.chat_template_kwargs or {})
    reserved = sorted(set(kwargs) & (_template_parameters(tokenizer) | {"messages", "chat_template"}))
    if reserved:
        name = reserved[0]
        what = ("client chat templates are not accepted: the server renders with the model's own"
                if name == "chat_template" else "it is not a template variable")
        raise bad_request(f"'chat_template_kwargs.{name}' is refused: {what}", f"chat_template_kwargs.{name}")
    return kwargs


def _message_dict(m: ChatMessage) -> dict:
    out: dict = {"role": "system" if m.role == "developer" else m.role}
    out["content"] = m.content if isinstance(m.content, str) or m.content is None else \
        [{"type": "text", "text": p.text} for p in m.content]
    if m.tool_calls:
        out["tool_calls"] = [c.model_dump() for c in m.tool_calls]
    for key in ("name", "tool_call_id", "reasoning_content"):
        if getattr(m, key) is not None:
            out[key] = getattr(m, key)
    return out


def _thinking(req: ChatPromptFields) -> bool | None:
    if req.enable_thinking is not None:
        return req.enable_thinking
    return (req.chat_template_kwargs or {}).get("enable_thinking")


def _forced_prefix(req: ChatPromptFields) -> str:
    choice = req.tool_choice
    if choice == "required":
        return CALL_START + "\n"
    if isinstance(choice, NamedToolChoice):
        name = choice.function.get("name")
        if not name or name not in {t.function.name for t in req.tools or []}:
            raise bad_request(f"tool_choice names function {name!r}, which is not in 'tools'", "tool_choice")
        return CALL_START + '\n{"name": ' + json.dumps(name) + ', "arguments": '
    return ""


def chat_prompt(tokenizer, req: ChatPromptFields, max_model_len: int, add_generation_prompt: bool = True,
                continue_final_message: bool = False) -> Prompt:
    """The rendered and tokenized chat; `add_generation_prompt` / `continue_final_message` are
    the template's switches (`/tokenize` exposes them; chat completions open a new assistant turn)."""
    use_tools = bool(req.tools) and req.tool_choice != "none"
    if req.tool_choice not in (None, "none", "auto") and not req.tools:
        raise bad_request("tool_choice requires 'tools'", "tool_choice")
    _check_parts(req)
    limit = max_prompt_bytes(tokenizer, max_model_len)
    _check_size(sum(_content_bytes(m) for m in req.messages), limit, "messages")
    kwargs = _template_kwargs(tokenizer, req)
    thinking = _thinking(req)
    if thinking is not None:
        kwargs["enable_thinking"] = thinking
    tools = [t.model_dump(exclude_none=True) for t in req.tools] if use_tools else None
    try:
        text = tokenizer.apply_chat_template([_message_dict(m) for m in req.messages], tools=tools,
                                             add_generation_prompt=add_generation_prompt,
                                             continue_final_message=continue_final_message, tokenize=False,
                                             **kwargs)
    except Exception as e:  # noqa: BLE001 - template errors are the request's fault
        raise bad_request(f"the messages could not be rendered with the chat template: {e}", "messages")
    forced = _forced_prefix(req) if use_tools else ""
    text += forced
    _check_size(len(text.encode("utf-8")), limit, "messages")
    ids = tokenizer.encode(text, add_special_tokens=False)
    return Prompt(ids, text, think_opened(text) and not forced, use_tools, forced)


def completion_prompt(tokenizer, req: CompletionRequest, max_model_len: int) -> Prompt:
    """The one prompt of a completion request: a string, token ids, or a list holding one of
    either (OpenAI's batch forms). Token ids have no text (`text` is ""); they are checked against
    the vocabulary on admission."""
    prompt = req.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise bad_request(f"'prompt' holds {len(prompt)} prompts: only one prompt per request is "
                              "supported; send one request per prompt", "prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        return Prompt(text_ids(tokenizer, prompt, max_model_len), prompt)
    return Prompt(list(prompt), "")


def text_ids(tokenizer, text: str, max_model_len: int, add_special_tokens: bool = False) -> list[int]:
    """The ids of a raw text prompt, refused by its size first when it cannot fit the context."""
    _check_size(len(text.encode("utf-8")), max_prompt_bytes(tokenizer, max_model_len), "prompt")
    return tokenizer.encode(text, add_special_tokens=add_special_tokens)


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
                fallback=req.fallback, fill=req.fill,
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
