"""Output parsing: from the tokens the engine committed to what a client sees (text cut at stop
strings, reasoning, tool calls, logprobs).

`ResponseText` detokenizes (EOS ids dropped, other special tokens kept so `<think>` and
`<tool_call>` survive) and cuts at the first stop string. `ChatView` splits the text into
reasoning, content and tool calls. Both have a `final=False` view that holds back whatever may
still change, so a stream of deltas always adds up to the final response.

Split a Qwen3-style response into `reasoning_content` and content (SPEC §10).

The thinking block is `<think>…</think>` at the start of the response, or everything up to
`</think>` when the prompt already opened `<think>`. Leading and trailing whitespace of the
reasoning, and the whitespace between `</think>` and the answer, are dropped. While the response
is still growing (`final=False`) whatever might still change is held back, so streamed pieces
are always prefixes of the final ones.

`<tool_call>{json}</tool_call>` blocks in a response -> OpenAI `tool_calls` (SPEC §10).

`split_tool_calls(text, final)` returns the content around the calls and the parsed calls. A block
whose JSON is not `{"name": str, "arguments": ...}` stays in the content as written. While the
response is still growing (`final=False`) the content stops before the first unfinished call and
before anything that may become `<tool_call>`, so streamed content is always a prefix of the
final content.

OpenAI `logprobs` of a response, from what the engine reports per committed token.

A block-diffusion token's log-probability is the one it was committed with: read from the processed
distribution (controls applied, before temperature) of the denoising step that filled its position,
the same distribution its confidence came from; the alternatives are that step's most likely tokens.
Tokens past a stop string are left out. EOS tokens are left out of chat logprobs, as they are of
the text; completions list them (OpenAI's legacy completions show `<|endoftext|>` too), so that a
client that counts tokens finds each one where it expects it: lm-eval scores a continuation as the
`echo`ed tokens between the context and the one generated token, whatever that token is.

`echo` with `logprobs` puts the prompt's tokens first: each with its log-probability given the
tokens before it from one causal pass (the first has none: null, as in OpenAI's), so likelihood
evaluation works over the API.

A stream carries in each chunk the logprobs of the tokens that start in the text it carries (a
`Cursor` per choice), so a stream's logprobs put together are the non-streamed ones.
"""

import json
from dataclasses import dataclass, field

from .schemas import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, FunctionCall, ToolCall, TopLogprob

CALL_START, CALL_END = "<tool_call>", "</tool_call>"


@dataclass
class ToolSplit:
    content: str
    calls: list[ToolCall]
    pending: bool  # an unfinished call (or its possible start) is being held back


def parse_call(body: str) -> ToolCall | None:
    """The JSON between the tags -> a ToolCall, or None when it is not a well-formed call."""
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    arguments = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return ToolCall(function=FunctionCall(name=obj["name"], arguments=arguments))


def partial_marker_len(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


def split_tool_calls(text: str, final: bool) -> ToolSplit:
    content, calls, pos = [], [], 0
    while True:
        start = text.find(CALL_START, pos)
        if start < 0:
            tail = text[pos:]
            hold = 0 if final else partial_marker_len(tail, CALL_START)
            content.append(tail[:len(tail) - hold])
            return ToolSplit("".join(content), calls, hold > 0)
        content.append(text[pos:start])
        end = text.find(CALL_END, start)
        if end < 0:
            if final:  # an unfinished call at the end stays as text
                content.append(text[start:])
            return ToolSplit("".join(content), calls, not final)
        call = parse_call(text[start + len(CALL_START):end].strip())
        if call is None:
            content.append(text[start:end + len(CALL_END)])
        else:
            calls.append(call)
        pos = end + len(CALL_END)
        if calls and not final:  # after the first call, hold everything until the end
            return ToolSplit("".join(content), calls, True)


THINK_START, THINK_END = "<think>", "</think>"


@dataclass
class ReasoningSplit:
    reasoning: str | None
    content: str


def split_reasoning(text: str, opened_in_prompt: bool, final: bool) -> ReasoningSplit:
    body = text
    if not opened_in_prompt:
        stripped = text.lstrip()
        if not stripped.startswith(THINK_START):
            if not final and THINK_START.startswith(stripped):
                return ReasoningSplit(None, "")  # may still become "<think>"
            return ReasoningSplit(None, text)
        body = stripped[len(THINK_START):]
    end = body.find(THINK_END)
    if end < 0:
        if final:
            return ReasoningSplit(body.strip(), "")
        hold = partial_marker_len(body, THINK_END)
        return ReasoningSplit(body[:len(body) - hold].lstrip().rstrip(), "")
    content = body[end + len(THINK_END):].lstrip()
    return ReasoningSplit(body[:end].strip(), content)


class ResponseText:
    def __init__(self, tokenizer, eos_ids: tuple[int, ...], stops: list[str]):
        self.tokenizer, self.eos_ids, self.stops = tokenizer, set(eos_ids), stops
        self.token_ids: list[int] = []
        self.logprobs: list = []  # per token: (logprob, [(id, logprob), ...]) when the request asked
        self.prompt_logprobs: list | None = None  # per prompt token (None first), when asked (`echo`)
        self.text = ""
        self.stopped = False  # a stop string was found; `text` ends before it

    def add(self, token_ids: list[int], final: bool = False, logprobs: list | None = None) -> None:
        """Append committed tokens (and their logprobs, if reported); `final` when no more will come
        (a trailing partial character then is what it is, and may complete a stop string)."""
        if self.stopped or (not token_ids and not final):
            return
        self.token_ids += token_ids
        self.logprobs += logprobs or []
        text = self.tokenizer.decode([t for t in self.token_ids if t not in self.eos_ids],
                                     skip_special_tokens=False)
        searchable = text if final else text.rstrip("\ufffd")
        cut = min((i for i in (searchable.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            text, self.stopped = text[:cut], True
        self.text = text

    def safe(self, final: bool) -> str:
        """The text that cannot change any more: no trailing partial character or stop string."""
        if final or self.stopped:
            return self.text
        text = self.text.rstrip("\ufffd")
        hold = max((partial_marker_len(text, s) for s in self.stops), default=0)
        return text[:len(text) - hold]


@dataclass
class ChatParts:
    reasoning: str | None
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)


class ChatView:
    """Reasoning / content / tool calls of a chat response, with per-call deltas for streaming."""

    def __init__(self, think_opened_in_prompt: bool, parse_tools: bool):
        self.opened, self.parse_tools = think_opened_in_prompt, parse_tools
        self.sent_reasoning, self.sent_content = "", ""

    def parts(self, text: str, final: bool) -> ChatParts:
        split = split_reasoning(text, self.opened, final)
        if not self.parse_tools:
            return ChatParts(split.reasoning, split.content)
        tools = split_tool_calls(split.content, final)
        return ChatParts(split.reasoning, tools.content, tools.calls if final else [])

    def delta(self, text: str, final: bool) -> tuple[str, str, ChatParts]:
        """New reasoning and content since the last call, and the current parts."""
        parts = self.parts(text, final)
        reasoning, content = parts.reasoning or "", parts.content
        d_reasoning = reasoning[len(self.sent_reasoning):] if reasoning.startswith(self.sent_reasoning) else ""
        d_content = content[len(self.sent_content):] if content.startswith(self.sent_content) else ""
        self.sent_reasoning += d_reasoning
        self.sent_content += d_content
        return d_reasoning, d_content, parts


def think_opened(prompt_text: str) -> bool:
    """Whether the prompt leaves a `<think>` open (the response then starts inside reasoning)."""
    tail = prompt_text.rstrip()
    return tail.endswith("<think>")


MAX_TOP_LOGPROBS = {"chat": 20, "completions": 5}  # OpenAI's limits


@dataclass
class Cursor:
    """How far a streamed response's logprobs have been shown: the tokens passed and the text
    offset after them. A stream shows each token once, when the text it starts in is sent."""

    tokens: int = 0
    offset: int = 0


def _shown(tokenizer, token_ids: list[int], logprobs: list, eos_ids: set[int], text: str,
           keep_eos: bool = False, cursor: Cursor | None = None) -> list:
    """(token text, offset in `text`, logprob entry) of the response tokens that make up `text`,
    and with `keep_eos` the EOS that ended it (at offset len(text); not one after a stop string).
    With a `cursor`, only the tokens after it, which it then passes; `text` may be a prefix of the
    final text (what a stream has sent), the tokens that start past it wait for a later call."""
    at = cursor or Cursor()
    shown = []
    for token_id, entry in zip(token_ids[at.tokens:], logprobs[at.tokens:]):
        if token_id in eos_ids:
            if keep_eos and at.offset == len(text):
                shown.append((tokenizer.decode([token_id], skip_special_tokens=False), at.offset, entry))
                at.tokens += 1
            break
        if at.offset >= len(text):  # past a stop string, or not sent yet
            break
        piece = tokenizer.decode([token_id], skip_special_tokens=False)
        shown.append((piece, at.offset, entry))
        at.tokens, at.offset = at.tokens + 1, at.offset + len(piece)
    return shown


def _prompt_shown(tokenizer, prompt_ids: list[int], prompt_logprobs: list) -> list:
    """(token text, offset in the echoed prompt, logprob entry or None) of every prompt token."""
    shown, offset = [], 0
    for token_id, entry in zip(prompt_ids, prompt_logprobs):
        piece = tokenizer.decode([token_id], skip_special_tokens=False)
        shown.append((piece, offset, entry))
        offset += len(piece)
    return shown


def _top(tokenizer, alternatives: list[tuple[int, float]], k: int) -> list[TopLogprob]:
    out = []
    for token_id, logprob in alternatives[:k]:
        piece = tokenizer.decode([token_id], skip_special_tokens=False)
        out.append(TopLogprob(token=piece, logprob=logprob, bytes=list(piece.encode())))
    return out


def chat_logprobs(tokenizer, token_ids: list[int], logprobs: list, eos_ids: set[int], text: str,
                  top: int, cursor: Cursor | None = None) -> ChatLogprobs:
    """The logprobs of the tokens that make up `text`; with a `cursor`, of those after it."""
    content = [ChatTokenLogprob(token=piece, logprob=lp, bytes=list(piece.encode()),
                                top_logprobs=_top(tokenizer, alternatives, top))
               for piece, _, (lp, alternatives) in _shown(tokenizer, token_ids, logprobs, eos_ids, text,
                                                          cursor=cursor)]
    return ChatLogprobs(content=content)


def _completion_entries(tokenizer, shown: list, top: int) -> CompletionLogprobs:
    return CompletionLogprobs(
        tokens=[piece for piece, _, _ in shown],
        token_logprobs=[None if entry is None else entry[0] for _, _, entry in shown],
        top_logprobs=[None if entry is None else {t.token: t.logprob for t in _top(tokenizer, entry[1], top)}
                      for _, _, entry in shown],
        text_offset=[offset for _, offset, _ in shown])


def completion_logprobs(tokenizer, token_ids: list[int], logprobs: list, eos_ids: set[int], text: str,
                        top: int, echo: str = "", prompt_ids: list[int] | None = None,
                        prompt_logprobs: list | None = None, cursor: Cursor | None = None,
                        final: bool = True) -> CompletionLogprobs:
    """The response's tokens at offsets after `echo`; with `prompt_logprobs` (per prompt token,
    None for the first) the prompt's tokens first, at offsets in `echo`. A stream passes its
    `cursor` and `final` (the EOS that ended the text is listed only once it is final)."""
    shown = [(piece, len(echo) + offset, entry)
             for piece, offset, entry in _shown(tokenizer, token_ids, logprobs, eos_ids, text, final, cursor)]
    if prompt_logprobs is not None:
        shown = _prompt_shown(tokenizer, prompt_ids, prompt_logprobs) + shown
    return _completion_entries(tokenizer, shown, top)
