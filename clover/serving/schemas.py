"""OpenAI-compatible request and response bodies (the subset Clover serves, plus its extensions).

Unknown request fields are ignored, as OpenAI-compatible servers do; fields Clover cannot honour
(image content parts, ...) are refused with a 400 naming them.
`response_format` (`text`, `json_object`, `json_schema`) is checked and compiled by `clover.structured`
when the request is admitted. Types are strict, as OpenAI's: `max_tokens: "5"` or `true` is refused, not
coerced; NaN and infinities are refused; a string holding a lone UTF-16 surrogate is refused.
"""

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MAX = 2**31 - 1
PlainValue = str | int | float | bool | None  # what `chat_template_kwargs` values may be


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def lone_surrogate(value: Any, path: str = "") -> str | None:
    """The path of the first string in `value` (nested dicts and lists) that holds a lone UTF-16
    surrogate (JSON's "\\ud800" without its pair), which no tokenizer can encode; else None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path or "body"
        return None
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = lone_surrogate(key, path) if isinstance(key, str) else None
        found = found or lone_surrogate(item, f"{path}.{key}" if path else str(key))
        if found:
            return found
    return None


class _Strict(BaseModel):
    """Request parts: strict types (no "5" -> 5, no true -> 1), no NaN or infinity."""
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


class _Request(_Strict):
    @model_validator(mode="before")
    @classmethod
    def _encodable(cls, data: Any) -> Any:
        where = lone_surrogate(data)
        if where:
            raise ValueError(f"'{where}' holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape), "
                             "which is not valid Unicode text")
        return data


# -- requests ----------------------------------------------------------------------------------

class TextPart(_Strict):
    """A content part. Only `text` parts are served; others are refused when the prompt is built."""
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)
    type: str = "text"
    text: str | None = None


class FunctionCall(_Strict):
    name: str
    arguments: str


class ToolCall(_Strict):
    id: str = Field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class FunctionDef(_Strict):
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(_Strict):
    type: Literal["function"] = "function"
    function: FunctionDef


class NamedToolChoice(_Strict):
    type: Literal["function"] = "function"
    function: dict[str, str]


class StreamOptions(_Strict):
    include_usage: bool = False


class SamplingFields(_Request):
    """Fields shared by chat and text completions (OpenAI's plus Clover's extensions)."""

    model: str
    max_tokens: int | None = Field(default=None, ge=1, le=INT32_MAX)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1, le=INT32_MAX)
    seed: int | None = Field(default=None, ge=INT64_MIN, le=INT64_MAX)
    stop: str | list[str] | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0)
    n: int = Field(default=1, ge=1, le=INT32_MAX)
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: bool | int | None = None
    response_format: dict[str, Any] | None = None
    # Clover extensions
    block_size: int | None = Field(default=None, le=INT32_MAX)
    threshold: float | None = None
    mode: str | None = None  # "block_diffusion", "ar" or "self_spec" (SPEC §7); None: the server's default
    fallback: str | None = None  # "confidence" or "causal" (block diffusion's fallback); None: the server's
    fill: str | None = None  # "threshold" or "prefix" (block diffusion's fill rule); None: the server's

    def stop_list(self) -> list[str]:
        """The stop strings; empty ones (`stop: ""`) stop nothing and are dropped."""
        if self.stop is None:
            return []
        return [s for s in ([self.stop] if isinstance(self.stop, str) else self.stop) if s]


class ChatPromptFields(_Request):
    """What the chat template renders (chat completions and `/tokenize` with `messages`)."""

    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    enable_thinking: bool | None = None  # Clover extension
    # vLLM's convention: extra template variables, plain values only (client templates are refused
    # when the prompt is built)
    chat_template_kwargs: dict[str, PlainValue] | None = None


class ChatCompletionRequest(SamplingFields, ChatPromptFields):
    max_completion_tokens: int | None = Field(default=None, ge=1)
    top_logprobs: int | None = None


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]  # OpenAI's four forms (one prompt is served)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(default=None, le=INT32_MAX)


class TokenizeRequest(ChatPromptFields):
    """vLLM's `/tokenize`: a `prompt` (tokenized as is) or chat `messages` (rendered with the chat
    template, as chat completions render them), exactly one of the two."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    add_generation_prompt: bool = True  # messages only
    continue_final_message: bool = False  # messages only: leave the last (assistant) message open
    add_special_tokens: bool | None = None  # None: vLLM's default, true for a prompt, false for messages
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _one_input(self) -> "TokenizeRequest":
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of 'prompt' (text) and 'messages' (a chat)")
        if self.add_generation_prompt and self.continue_final_message and self.messages is not None:
            raise ValueError("'continue_final_message' and 'add_generation_prompt' cannot both be true "
                             "(set add_generation_prompt to false to continue the last message)")
        return self


class DetokenizeRequest(_Request):
    model: str | None = None
    tokens: list[int]


# -- responses ---------------------------------------------------------------------------------

class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None = None


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float | None]  # None for the first prompt token with `echo` (no context)
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str | None
    logprobs: ChatLogprobs | None = None


class _CompletionObject(BaseModel):
    """The head OpenAI's completion objects share; each narrows `object` to its own literal (a
    narrowed field keeps its place, so the JSON keys stay in OpenAI's order: id, object, created, ...)."""

    id: str
    object: str
    created: int = Field(default_factory=now)
    model: str


class ChatCompletion(_CompletionObject):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage


class ToolCallDelta(BaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: dict[str, str] | None = None


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    finish_reason: str | None = None
    logprobs: ChatLogprobs | None = None  # those of the tokens this chunk carries, when asked for


class ChatCompletionChunk(_CompletionObject):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: str | None
    logprobs: CompletionLogprobs | None = None


class Completion(_CompletionObject):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=now)
    owned_by: str = "clover"
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeResponse(BaseModel):
    prompt: str
