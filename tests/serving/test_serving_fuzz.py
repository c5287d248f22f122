"""Property-based fuzzing of both OpenAI endpoints (hypothesis): generated bodies, with every known
field set to a plausible value or to any JSON value, strings over all of Unicode (lone surrogates
included), streamed and not, never give a 5xx; every refusal is in OpenAI's error shape; every
200 is a complete response or stream. Afterwards the server still answers correctly and holds no
request. Derandomized, so CI runs the same examples every time."""

import json

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from clover.serving import ServerConfig
from serve_fixtures import make_tokenizer, serve_scripted
from test_serving_errors import KEY, MODEL, assert_error_shape, chat_body, client_for, raw

EXAMPLES = 120
TIMEOUT_S = 30  # a scripted answer takes milliseconds: a request this slow is hung
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# all of Unicode, with lone surrogates, NUL and the chat format's special tokens made likely
pieces = st.one_of(st.characters(exclude_categories=()), st.characters(exclude_categories=()),
                       st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, exclude_categories=()),
                       st.sampled_from(["\x00", "\n", "<|mask|>", "<|im_start|>", "<|im_end|>", "<think>",
                                        "</think>", "<tool_call>", "{{", "{%"]))
any_text = st.lists(pieces, max_size=30).map("".join)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | any_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(any_text, inner, max_size=4),
    max_leaves=12)


def either(plausible):
    """A plausible value for a field (mostly), or any JSON value at all."""
    return st.one_of(plausible, plausible, plausible, plausible, json_values)


SAMPLING = {
    "max_tokens": either(st.integers(-2, 5000) | st.just(2**70)),
    "temperature": either(st.floats(-1, 3, allow_nan=False)),
    "top_p": either(st.floats(-0.5, 1.5, allow_nan=False)),
    "top_k": either(st.integers(-3, 400)),
    "seed": either(st.integers(-(2**64), 2**64)),
    "stop": either(any_text | st.lists(any_text, max_size=3)),
    "presence_penalty": either(st.floats(-3, 3, allow_nan=False)),
    "frequency_penalty": either(st.floats(-3, 3, allow_nan=False)),
    "repetition_penalty": either(st.floats(-1, 3, allow_nan=False)),
    "n": either(st.integers(0, 3)),
    "stream": either(st.booleans()),
    "stream_options": either(st.fixed_dictionaries({"include_usage": st.booleans()})),
    "logprobs": either(st.booleans()),
    "response_format": either(st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object", "x"])})),
    "block_size": either(st.sampled_from([0, 1, 3, 4, 16, 32, 64, -4])),
    "threshold": either(st.floats(-0.5, 1.5, allow_nan=False)),
    "unknown_field": json_values,
}
model_names = st.sampled_from([MODEL, MODEL, MODEL, "gpt-4"]) | json_values

content_part = st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"])},
                                     optional={"text": either(any_text), "image_url": json_values})
message = st.fixed_dictionaries(
    {"role": either(st.sampled_from(["system", "developer", "user", "assistant", "tool"]))},
    optional={"content": either(any_text | st.lists(content_part, max_size=2)), "name": either(any_text),
              "tool_call_id": either(any_text), "reasoning_content": either(any_text)})
tool = st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": either(st.sampled_from(["get_weather", "f"]))},
    optional={"parameters": either(st.just({"type": "object", "properties": {}}))})})
CHAT = {
    "messages": either(st.lists(message, min_size=1, max_size=3)),
    "max_completion_tokens": either(st.integers(-2, 100)),
    "tools": either(st.lists(tool, max_size=2)),
    "tool_choice": either(st.sampled_from(["none", "auto", "required"])
                          | st.fixed_dictionaries({"type": st.just("function"),
                                                   "function": st.fixed_dictionaries({"name": any_text})})),
    "enable_thinking": either(st.booleans()),
    "chat_template_kwargs": either(st.dictionaries(st.sampled_from(["enable_thinking", "chat_template", "x"]),
                                                   st.booleans() | any_text, max_size=2)),
}
COMPLETION = {
    "prompt": either(any_text | st.lists(any_text, min_size=1, max_size=2)
                     | st.lists(st.integers(-5, 400), min_size=1, max_size=20)),
    "echo": either(st.booleans()),
    "suffix": either(any_text),
    "best_of": either(st.integers(0, 3)),
}


def bodies(fields: dict, required: str):
    """A request object (mostly), or now and then any JSON value instead of one."""
    obj = st.fixed_dictionaries({"model": model_names, required: fields[required]},
                                optional={**SAMPLING, **{k: v for k, v in fields.items() if k != required}})
    return st.one_of(obj, obj, obj, obj, json_values)


@pytest.fixture(scope="module")
def server():
    srv = serve_scripted(make_tokenizer(), ServerConfig(served_model_name=MODEL, api_key=KEY))
    yield srv
    srv.stop()


def check_answer(srv, path: str, body) -> None:
    status, headers, parsed = raw(srv, "POST", path, json.dumps(body), timeout=TIMEOUT_S)
    event(f"status {status}")
    assert status < 500, (body, parsed)
    if status != 200:
        assert_error_shape(parsed)
        return
    if isinstance(parsed, str):  # a stream: data lines, the last [DONE], no error event
        events = [line[len("data: "):] for line in parsed.split("\n") if line.startswith("data: ")]
        assert events and events[-1] == "[DONE]", (body, parsed)
        chunks = [json.loads(e) for e in events[:-1]]
        assert all("error" not in c for c in chunks), (body, chunks)
        assert any(c["choices"] and c["choices"][0].get("finish_reason") for c in chunks), (body, chunks)
    else:
        assert parsed["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls"), (body, parsed)


@FUZZ
@given(body=bodies(CHAT, "messages"))
def test_fuzz_chat_completions(server, body):
    check_answer(server, "/v1/chat/completions", body)


@FUZZ
@given(body=bodies(COMPLETION, "prompt"))
def test_fuzz_completions(server, body):
    check_answer(server, "/v1/completions", body)


def test_server_is_sound_after_fuzzing(server):
    """Runs after the fuzz tests (file order): correct answers, no 5xx counted, nothing held."""
    client = client_for(server)
    assert client.chat.completions.create(**chat_body()).choices[0].message.content == "The answer is 4."
    text = client.completions.create(model=MODEL, prompt="hello", max_tokens=40).choices[0].text
    assert text.endswith("The answer is 4.")
    counted = [s.labels["code"] for family in server.app.state.metrics.http_responses.collect()
               for s in family.samples if s.name == "clover_http_responses_total"]
    assert counted and not any(code.startswith("5") for code in counted), counted
    scheduler = server.app.state.slot.runtime.engine.scheduler
    assert scheduler.num_running == 0 and scheduler.num_waiting == 0
