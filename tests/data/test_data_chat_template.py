"""The Qwen3-style chat template renders every role, tools and the thinking switch."""

from __future__ import annotations

import json

import pytest

from clover.data.tokenizer import train_tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "set_zone",
            "description": "Create a no-fly zone",
            "parameters": {"type": "object", "properties": {"radius_km": {"type": "number"}}},
        },
    }
]


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(["hello world, user assistant system"] * 10, vocab_size=400)


def render(tok, messages, **kwargs):
    kwargs.setdefault("tokenize", False)
    return tok.apply_chat_template(messages, **kwargs)


def test_plain_turns_and_generation_prompt(tok):
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Again"},
    ]
    out = render(tok, msgs, add_generation_prompt=True, enable_thinking=True)
    assert out == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello.<|im_end|>\n"
        "<|im_start|>user\nAgain<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_enable_thinking_switch(tok):
    msgs = [{"role": "user", "content": "Q"}]
    base = "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"
    assert render(tok, msgs, add_generation_prompt=True) == base
    assert render(tok, msgs, add_generation_prompt=True, enable_thinking=True) == base
    off = render(tok, msgs, add_generation_prompt=True, enable_thinking=False)
    assert off == base + "<think>\n\n</think>\n\n"
    assert render(tok, msgs, add_generation_prompt=False) == "<|im_start|>user\nQ<|im_end|>\n"


def test_tools_go_into_system_prompt(tok):
    msgs = [{"role": "system", "content": "You plan flights."}, {"role": "user", "content": "Close the park."}]
    out = render(tok, msgs, add_generation_prompt=True, enable_thinking=False, tools=TOOLS)
    assert out.startswith("<|im_start|>system\nYou plan flights.\n\n# Tools\n")
    assert "<tools>\n" + json.dumps(TOOLS[0], ensure_ascii=False) + "\n</tools>" in out
    assert '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' in out
    assert out.count("<|im_start|>system") == 1
    assert out.endswith("<|im_start|>user\nClose the park.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_tools_without_system_message(tok):
    out = render(tok, [{"role": "user", "content": "x"}], tools=TOOLS)
    assert out.startswith("<|im_start|>system\n# Tools\n")


def test_tool_calls_and_tool_responses(tok):
    msgs = [
        {"role": "user", "content": "Close it."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "set_zone", "arguments": {"radius_km": 2.5}}},
                {"name": "notify", "arguments": '{"who": "all"}'},
            ],
        },
        {"role": "tool", "content": '{"ok": true}'},
        {"role": "tool", "content": "sent"},
        {"role": "assistant", "content": "Done.", "reasoning_content": "both calls worked"},
    ]
    out = render(tok, msgs)
    assert out == (
        "<|im_start|>user\nClose it.<|im_end|>\n"
        "<|im_start|>assistant\n"
        '<tool_call>\n{"name": "set_zone", "arguments": {"radius_km": 2.5}}\n</tool_call>\n'
        '<tool_call>\n{"name": "notify", "arguments": {"who": "all"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n{\"ok\": true}\n</tool_response>\n"
        "<tool_response>\nsent\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\nboth calls worked\n</think>\n\nDone.<|im_end|>\n"
    )


def test_tool_call_after_content_is_on_new_line(tok):
    msgs = [{"role": "assistant", "content": "Calling.", "tool_calls": [{"name": "f", "arguments": {}}]}]
    out = render(tok, msgs)
    assert out == '<|im_start|>assistant\nCalling.\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call><|im_end|>\n'


def test_rendered_text_tokenizes_with_single_special_ids(tok):
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                  enable_thinking=False, tokenize=True, return_dict=False)
    assert ids[0] == 1 and ids.count(2) == 1 and 3 in ids and 4 in ids
