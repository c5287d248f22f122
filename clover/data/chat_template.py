"""The Qwen3-style chat template (Jinja) that Clover tokenizers carry.

Rendering contract (matches Qwen3's layout):
  * every turn is ``<|im_start|>{role}\\n{content}<|im_end|>\\n``;
  * ``tools`` go into the system turn: the system text (if any), a blank line, then a
    ``# Tools`` section listing one JSON object per tool inside ``<tools>...</tools>``
    and the ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` instruction;
  * assistant ``tool_calls`` become ``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>``
    blocks after the content, separated by newlines; ``arguments`` may be a dict or a
    JSON string; an OpenAI-style ``{"function": {...}}`` wrapper is unwrapped;
  * an assistant ``reasoning_content`` is rendered as ``<think>\\n...\\n</think>\\n\\n``
    before the content;
  * ``tool`` messages are tool results: consecutive ones share a single ``user`` turn,
    each wrapped as ``\\n<tool_response>\\n...\\n</tool_response>`` (Qwen3's convention);
  * ``add_generation_prompt`` appends ``<|im_start|>assistant\\n``; with
    ``enable_thinking=False`` an empty ``<think>\\n\\n</think>\\n\\n`` follows it, with
    ``enable_thinking`` true or unset nothing follows (the model opens ``<think>`` itself).
"""

from __future__ import annotations

CHAT_TEMPLATE: str = (
    "{%- macro text(content) -%}"
    "{%- if content is none -%}"
    "{%- elif content is string -%}{{- content -}}"
    "{%- else -%}{%- for part in content -%}{{- part.text if part.text is defined else '' -}}"
    "{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    # -- system turn, with tools folded in ------------------------------------
    "{%- set has_system = messages | length > 0 and messages[0].role == 'system' -%}"
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if has_system -%}{{- text(messages[0].content) + '\\n\\n' -}}{%- endif -%}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name "
    "and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    '{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n'
    "</tool_call><|im_end|>\\n' -}}"
    "{%- elif has_system -%}"
    "{{- '<|im_start|>system\\n' + text(messages[0].content) + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    # -- the conversation -------------------------------------------------------
    "{%- for message in messages -%}"
    "{%- if message.role == 'system' -%}"
    "{%- if not loop.first -%}"
    "{{- '<|im_start|>system\\n' + text(message.content) + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- elif message.role == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if message.reasoning_content is defined and message.reasoning_content -%}"
    "{{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{%- set body = text(message.content) -%}"
    "{{- body -}}"
    "{%- if message.tool_calls is defined and message.tool_calls -%}"
    "{%- for call in message.tool_calls -%}"
    "{%- if body or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    "{%- set fn = call.function if call.function is defined else call -%}"
    "{{- '<tool_call>\\n{\"name\": \"' + fn.name + '\", \"arguments\": ' -}}"
    "{%- if fn.arguments is string -%}{{- fn.arguments -}}"
    "{%- else -%}{{- fn.arguments | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif message.role == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}"
    "{{- '<|im_start|>user' -}}"
    "{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + text(message.content) + '\\n</tool_response>' -}}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + text(message.content) + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    # -- generation prompt ------------------------------------------------------
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
)
