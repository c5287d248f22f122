"""From committed token ids to what a client sees: text, stop strings, reasoning, tool calls.

`ResponseText` detokenizes (EOS ids dropped, other special tokens kept so `<think>` and
`<tool_call>` survive) and cuts at the first stop string. `ChatView` splits the text into
reasoning, content and tool calls. Both have a `final=False` view that holds back whatever may
still change, so a stream of deltas always adds up to the final response.
"""

from dataclasses import dataclass, field

from .reasoning import split_reasoning
from .schemas import ToolCall
from .tool_parser import partial_marker_len, split_tool_calls


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

