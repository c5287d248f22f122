"""Every refusal in OpenAI's error shape, and the server surviving failures: 400 (bad parameters,
malformed JSON, context overflow), 401, 404, 413, 429 with Retry-After, 503 while loading, 500
without a traceback."""

import http.client
import json
import threading
import time

import openai
import pytest

from clover.serving import EngineConfig, Runtime, SchedulerConfig, ServerConfig, create_app
from serve_fixtures import (GatedModel, ScriptedModel, ServerThread, scripted_answer,
                            serve_scripted, wait_ready)

MODEL = "scripted"
KEY = "sk-test-key"
LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def server(tok):
    srv = serve_scripted(tok, ServerConfig(served_model_name=MODEL, api_key=KEY, max_body_bytes=LIMIT))
    yield srv
    srv.stop()


def client_for(srv, key=KEY):
    return openai.OpenAI(api_key=key, base_url=srv.base_url + "/v1", max_retries=0, timeout=60)


def raw(srv, method, path, body=None, headers=None, key=KEY, timeout=60):
    """(status, lower-cased headers, parsed JSON body or text) of one plain HTTP request."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=timeout)
    h = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {}),
         **(headers or {})}
    data = body if isinstance(body, (str, bytes)) or body is None else json.dumps(body)
    conn.request(method, path, data, h)
    resp = conn.getresponse()
    text = resp.read().decode()
    headers = {k.lower(): v for k, v in resp.getheaders()}
    try:
        return resp.status, headers, json.loads(text)
    except json.JSONDecodeError:
        return resp.status, headers, text


def assert_error_shape(body, status_type=None):
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"] and "Traceback" not in body["error"]["message"]
    if status_type:
        assert body["error"]["type"] == status_type


def chat_body(**kw):
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 40, **kw}


def test_api_key_enforced(server):
    assert client_for(server).chat.completions.create(**chat_body()).choices[0].message.content
    for key in (None, "sk-wrong", KEY + "x", ""):
        status, _, body = raw(server, "POST", "/v1/chat/completions", chat_body(), key=key)
        assert status == 401, key
        assert_error_shape(body, "authentication_error")
    with pytest.raises(openai.AuthenticationError):
        client_for(server, "sk-wrong").models.list()
    status, _, body = raw(server, "POST", "/v1/chat/completions", "{broken", key=None)
    assert status == 401  # the key is checked before the body is parsed
    assert raw(server, "GET", "/health", key=None)[0] == 200
    assert raw(server, "GET", "/metrics", key=None)[0] == 401  # metrics are behind the key too
    assert raw(server, "GET", "/metrics")[0] == 200


def test_unknown_model(server):
    with pytest.raises(openai.NotFoundError) as e:
        client_for(server).chat.completions.create(**{**chat_body(), "model": "gpt-4"})
    assert e.value.body["code"] == "model_not_found"
    status, _, body = raw(server, "POST", "/v1/completions", {"model": "nope", "prompt": "x"})
    assert status == 404
    assert_error_shape(body)


@pytest.mark.parametrize("override,param", [
    ({"temperature": 3.0}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"block_size": 3}, "block_size"),
    ({"threshold": 0.0}, "threshold"),
    ({"threshold": 1.5}, "threshold"),
    ({"n": 65}, "n"),
    ({"n": 65, "stream": True}, "n"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"logprobs": 3}, "logprobs"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, None),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"presence_penalty": 9}, "presence_penalty"),
])
def test_bad_parameters(server, override, param):
    status, _, body = raw(server, "POST", "/v1/chat/completions", chat_body(**override))
    assert status == 400
    assert_error_shape(body, "invalid_request_error")
    if param:
        assert body["error"]["param"].startswith(param)


def test_too_many_choices_are_refused_clearly(server):
    with pytest.raises(openai.BadRequestError) as e:
        client_for(server).chat.completions.create(**chat_body(), n=65, stream=True)
    assert "n=65" in e.value.message and "64 choices" in e.value.message


@pytest.mark.parametrize("data", ["{not json", "", "[1, 2]", '{"model": "scripted", "messages": "hi"}', b"\xff\xfe"])
def test_malformed_body_is_400(server, data):
    status, _, body = raw(server, "POST", "/v1/chat/completions", data)
    assert status == 400
    assert_error_shape(body, "invalid_request_error")


def test_context_overflow_states_the_numbers(server):
    status, _, body = raw(server, "POST", "/v1/chat/completions", chat_body(max_tokens=5000))
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"
    message = body["error"]["message"]
    assert "4096" in message and "5000" in message
    long_prompt = {"model": MODEL, "prompt": [9] * 4090, "max_tokens": 16}
    status, _, body = raw(server, "POST", "/v1/completions", long_prompt)
    assert status == 400 and "4090" in body["error"]["message"]


def test_prompt_with_mask_token_is_refused(server):
    status, _, body = raw(server, "POST", "/v1/completions", {"model": MODEL, "prompt": "a<|mask|>b"})
    assert status == 400 and "mask" in body["error"]["message"]


def test_oversized_body_is_413(server):
    big = chat_body(messages=[{"role": "user", "content": "x" * (LIMIT + 10)}])
    status, _, body = raw(server, "POST", "/v1/chat/completions", big)
    assert status == 413
    assert_error_shape(body)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)  # chunked: no length given
    chunks = iter([json.dumps(big).encode()[i:i + 8192] for i in range(0, LIMIT + 9000, 8192)])
    conn.request("POST", "/v1/chat/completions", chunks, {"Authorization": f"Bearer {KEY}",
                                                           "Content-Type": "application/json"},
                 encode_chunked=True)
    assert conn.getresponse().status == 413


def test_internal_error_keeps_serving(server):
    status, _, body = raw(server, "POST", "/v1/chat/completions",
                          chat_body(messages=[{"role": "user", "content": "EXPLODE"}]))
    assert status == 500
    assert_error_shape(body, "server_error")
    assert "scripted failure" not in json.dumps(body)
    client = client_for(server)
    for n in (1, 3):  # a failing choice ends the stream of all of them
        with pytest.raises(openai.APIError):
            list(client.chat.completions.create(**chat_body(messages=[{"role": "user", "content": "EXPLODE"}]),
                                                stream=True, n=n))
    assert client.chat.completions.create(**chat_body()).choices[0].message.content == "The answer is 4."
    scheduler = server.app.state.slot.runtime.engine.scheduler
    assert scheduler.num_running == 0 and scheduler.num_waiting == 0


def test_queue_full_is_429_with_retry_after(tok):
    model = GatedModel(tok)
    config = EngineConfig(SchedulerConfig(max_batch_size=1, max_queue=1), num_threads=1)
    app = create_app(ServerConfig(served_model_name=MODEL),
                     lambda metrics: Runtime.from_objects(model, tok, config, metrics))
    srv = ServerThread(app).start()
    try:
        model.gate.set()
        wait_ready(client_for(srv))
        model.gate.clear()
        engine = app.state.slot.runtime.engine
        results = []
        workers = [threading.Thread(target=lambda: results.append(raw(srv, "POST", "/v1/chat/completions",
                                                                      chat_body())[0])) for _ in range(2)]
        workers[0].start()
        wait_for(lambda: engine.scheduler.num_running == 1)  # admitted, held in its forward
        workers[1].start()
        wait_for(lambda: engine.scheduler.num_waiting == 1)  # the queue is full
        status, headers, body = raw(srv, "POST", "/v1/chat/completions", chat_body())
        assert status == 429 and int(headers["retry-after"]) >= 1
        assert_error_shape(body, "rate_limit_error")
        model.gate.set()
        for w in workers:
            w.join(timeout=60)
        assert results == [200, 200]
    finally:
        model.gate.set()
        srv.stop()


def test_loading_is_503(tok):
    loaded = threading.Event()

    def load(metrics):
        loaded.wait(timeout=60)
        return Runtime.from_objects(ScriptedModel(tok, scripted_answer), tok, EngineConfig(num_threads=1), metrics)

    srv = ServerThread(create_app(ServerConfig(served_model_name=MODEL), load)).start()
    try:
        status, headers, body = raw(srv, "POST", "/v1/chat/completions", chat_body())
        assert status == 503 and "retry-after" in headers
        assert_error_shape(body, "service_unavailable")
        assert raw(srv, "GET", "/health")[0] == 503
        loaded.set()
        wait_ready(client_for(srv))
        assert raw(srv, "GET", "/health")[0] == 200
    finally:
        loaded.set()
        srv.stop()


def wait_for(condition, timeout: float = 30) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, "timed out"
        time.sleep(0.01)
