"""Requests -> prompt token ids: the chat template for chat completions, raw text for completions.

`tool_choice`: "none" hides the tools and parses nothing; "auto" (the default with tools) lets the
model decide; "required" and a named function open the call in the prompt (`<tool_call>\\n` and
`{"name": ..., "arguments": `), and that forced prefix is put back in front of the response
before parsing.
"""

import json
from dataclasses import dataclass

from .errors import bad_request
from .output import think_opened
from .schemas import ChatCompletionRequest, ChatMessage, CompletionRequest, NamedToolChoice
from .tool_parser import CALL_START


@dataclass
class Prompt:
    ids: list[int]
    text: str
    think_opened: bool = False  # the response starts inside <think>
    parse_tools: bool = False
    forced_prefix: str = ""  # response text the prompt already holds (a forced tool call)


def _message_dict(m: ChatMessage) -> dict:
    out: dict = {"role": "system" if m.role == "developer" else m.role}
    out["content"] = m.content if isinstance(m.content, str) or m.content is None else \
        [p.model_dump(exclude_none=True) for p in m.content]
    if m.tool_calls:
        out["tool_calls"] = [c.model_dump() for c in m.tool_calls]
    for key in ("name", "tool_call_id", "reasoning_content"):
        if getattr(m, key) is not None:
            out[key] = getattr(m, key)
    return out


def _thinking(req: ChatCompletionRequest) -> bool | None:
    if req.enable_thinking is not None:
        return req.enable_thinking
    return (req.chat_template_kwargs or {}).get("enable_thinking")


def _forced_prefix(req: ChatCompletionRequest) -> str:
    choice = req.tool_choice
    if choice == "required":
        return CALL_START + "\n"
    if isinstance(choice, NamedToolChoice):
        name = choice.function.get("name")
        if not name or name not in {t.function.name for t in req.tools or []}:
            raise bad_request(f"tool_choice names function {name!r}, which is not in 'tools'", "tool_choice")
        return CALL_START + '\n{"name": ' + json.dumps(name) + ', "arguments": '
    return ""


def chat_prompt(tokenizer, req: ChatCompletionRequest) -> Prompt:
    use_tools = bool(req.tools) and req.tool_choice != "none"
    if req.tool_choice not in (None, "none", "auto") and not req.tools:
        raise bad_request("tool_choice requires 'tools'", "tool_choice")
    kwargs = dict(req.chat_template_kwargs or {})
    thinking = _thinking(req)
    if thinking is not None:
        kwargs["enable_thinking"] = thinking
    tools = [t.model_dump(exclude_none=True) for t in req.tools] if use_tools else None
    try:
        text = tokenizer.apply_chat_template([_message_dict(m) for m in req.messages], tools=tools,
                                             add_generation_prompt=True, tokenize=False, **kwargs)
    except Exception as e:  # noqa: BLE001 - template errors are the request's fault
        raise bad_request(f"the messages could not be rendered with the chat template: {e}", "messages")
    forced = _forced_prefix(req) if use_tools else ""
    text += forced
    ids = tokenizer.encode(text, add_special_tokens=False)
    return Prompt(ids, text, think_opened(text) and not forced, use_tools, forced)


def completion_prompt(tokenizer, req: CompletionRequest) -> Prompt:
    prompt = req.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        if len(prompt) != 1:
            raise bad_request("only one prompt per request is supported; send one request per prompt",
                              "prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        return Prompt(tokenizer.encode(prompt, add_special_tokens=False), prompt)
    return Prompt(list(prompt), "")  # token ids are checked against the vocabulary on admission
