"""Requests -> prompt token ids: the chat template for chat completions, raw text for completions.

`tool_choice`: "none" hides the tools and parses nothing; "auto" (the default with tools) lets the
model decide; "required" and a named function open the call in the prompt (`<tool_call>\\n` and
`{"name": ..., "arguments": `), and that forced prefix is put back in front of the response
before parsing.

Both run off the event loop (the handlers call them in a worker thread). A prompt is refused by its
UTF-8 size before it is rendered or tokenized when it cannot fit the context whatever it holds:
`max_prompt_bytes` = context tokens x the most bytes one vocabulary entry spells x
NORMALIZATION_SLACK (a normalizer such as NFC may shrink the text before it is split: at most 3x).
The client cannot bring its own chat template: `chat_template_kwargs` only sets template
variables, never an argument of `apply_chat_template` (`chat_template`, `tools`, ...).
"""

import inspect
import json
from dataclasses import dataclass

from .errors import bad_request
from .output import think_opened
from .schemas import ChatMessage, ChatPromptFields, CompletionRequest, NamedToolChoice
from .tool_parser import CALL_START

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
