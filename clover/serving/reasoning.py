"""Split a Qwen3-style response into `reasoning_content` and content (SPEC §10).

The thinking block is `<think>…</think>` at the start of the response, or everything up to
`</think>` when the prompt already opened `<think>`. Leading and trailing whitespace of the
reasoning, and the whitespace between `</think>` and the answer, are dropped. While the response
is still growing (`final=False`) whatever might still change is held back, so streamed pieces
are always prefixes of the final ones.
"""

from dataclasses import dataclass

from .tool_parser import partial_marker_len

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
