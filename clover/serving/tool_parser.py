"""`<tool_call>{json}</tool_call>` blocks in a response -> OpenAI `tool_calls` (SPEC §10).

`split_tool_calls(text, final)` returns the content around the calls and the parsed calls. A block
whose JSON is not `{"name": str, "arguments": ...}` stays in the content as written. While the
response is still growing (`final=False`) the content stops before the first unfinished call and
before anything that may become `<tool_call>`, so streamed content is always a prefix of the
final content.
"""

import json
from dataclasses import dataclass

from .schemas import FunctionCall, ToolCall

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
