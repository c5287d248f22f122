"""Tool calls and reasoning through the `openai` client, with a scripted model that answers
deterministically (a tool call when tools are offered, a thought then an answer otherwise)."""

import json

import openai
import pytest

from clover.serving import EngineConfig, Runtime, ServerConfig, create_app
from serve_fixtures import ScriptedModel, ServerThread, make_tokenizer, scripted_answer, wait_ready

MODEL = "scripted"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@pytest.fixture(scope="module")
def client():
    tok = make_tokenizer()
    model = ScriptedModel(tok, scripted_answer)
    app = create_app(ServerConfig(served_model_name=MODEL),
                     lambda metrics: Runtime.from_objects(model, tok, EngineConfig(num_threads=1), metrics))
    srv = ServerThread(app).start()
    client = openai.OpenAI(api_key="unused", base_url=srv.base_url + "/v1", max_retries=0, timeout=60)
    wait_ready(client)
    yield client
    srv.stop()


def ask(client, messages, **kw):
    return client.chat.completions.create(model=MODEL, messages=messages, max_tokens=64, **kw)


def test_tool_round_trip(client):
    messages = [{"role": "system", "content": "You are helpful."},
                {"role": "user", "content": "What is the weather in Paris?"}]
    first = ask(client, messages, tools=TOOLS, tool_choice="auto")
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps({"sky": "sunny"})})
    final = ask(client, messages, tools=TOOLS)
    assert final.choices[0].message.content == "It is sunny in Paris."
    assert final.choices[0].finish_reason == "stop" and not final.choices[0].message.tool_calls


def test_tool_call_streamed(client):
    chunks = list(ask(client, [{"role": "user", "content": "Weather?"}], tools=TOOLS, stream=True,
                      extra_body={"block_size": 4}))
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ""
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]


def test_tool_choice_none_hides_tools(client):
    r = ask(client, [{"role": "user", "content": "Weather?"}], tools=TOOLS, tool_choice="none",
            extra_body={"enable_thinking": False})
    assert r.choices[0].message.content == "The answer is 4." and not r.choices[0].message.tool_calls


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_tool_choice(client, choice):
    """"required" and a named function open the call in the prompt; the parsed call is complete."""
    r = ask(client, [{"role": "user", "content": "Hi"}], tools=TOOLS, tool_choice=choice)
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    assert r.choices[0].finish_reason == "tool_calls"


def test_reasoning_content(client):
    r = ask(client, [{"role": "user", "content": "What is 2+2?"}])
    message = r.choices[0].message
    assert message.reasoning_content == "Let me think." and message.content == "The answer is 4."


def test_reasoning_streamed(client):
    chunks = list(ask(client, [{"role": "user", "content": "What is 2+2?"}], stream=True,
                      extra_body={"block_size": 2}))
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert (reasoning, content) == ("Let me think.", "The answer is 4.")


@pytest.mark.parametrize("switch", [{"enable_thinking": False},
                                    {"chat_template_kwargs": {"enable_thinking": False}}])
def test_thinking_switched_off_per_request(client, switch):
    r = ask(client, [{"role": "user", "content": "What is 2+2?"}], extra_body=switch)
    message = r.choices[0].message
    assert message.reasoning_content is None and message.content == "The answer is 4."
