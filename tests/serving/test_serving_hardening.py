"""Bad input gets a clear 400 (never a 500), nothing the client sends runs on the server, and slow
or idle clients cannot hold the server: each case of issue 11, on a scripted model."""

import json
import socket
import threading
import time

import pytest

from clover.serving import EngineConfig, Runtime, ServerConfig, create_app
from clover.serving.admission import chat_prompt, completion_prompt, max_prompt_bytes
from clover.serving.http_server import ConnectionLimits
from clover.serving.schemas import ChatCompletionRequest, CompletionRequest
from serve_fixtures import ScriptedModel, ServerThread, make_tokenizer, scripted_answer, serve_scripted, wait_ready
from test_serving_errors import KEY, MODEL, assert_error_shape, chat_body, client_for, raw

BODY_LIMIT = 1024 * 1024


@pytest.fixture(scope="module")
def server(tok):
    srv = serve_scripted(tok, ServerConfig(served_model_name=MODEL, api_key=KEY, max_body_bytes=BODY_LIMIT))
    yield srv
    srv.stop()


def completion_body(**kw):
    return {"model": MODEL, "prompt": "hello", "max_tokens": 40, **kw}


def post(srv, path, body, stream=False):
    """(status, parsed body); a streamed 200 is parsed into its list of SSE payloads."""
    status, _, parsed = raw(srv, "POST", path, {**body, "stream": stream} if isinstance(body, dict) else body)
    if stream and status == 200:
        events = [line[len("data: "):] for line in parsed.split("\n") if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        parsed = [json.loads(e) for e in events[:-1]]
    return status, parsed


def refused(srv, path, body, param=None, stream=False, contains=None):
    status, parsed = post(srv, path, body, stream)
    assert status == 400, (body, parsed)
    assert_error_shape(parsed, "invalid_request_error")
    if param is not None:
        assert parsed["error"]["param"] == param, parsed
    if contains is not None:
        assert contains in parsed["error"]["message"], parsed
    return parsed["error"]


@pytest.mark.parametrize("stream", [False, True])
def test_lone_surrogate_is_400(server, stream):
    refused(server, "/v1/completions", completion_body(prompt="a\ud800b"), stream=stream, contains="'prompt'")
    body = chat_body(messages=[{"role": "user", "content": "a\udc00b"}])
    refused(server, "/v1/chat/completions", body, stream=stream, contains="messages.0.content")
    refused(server, "/v1/chat/completions", chat_body(stop=["x\ud800"]), stream=stream, contains="stop.0")
    ok = chat_body(messages=[{"role": "user", "content": "smile \U0001F600"}])  # a proper pair is fine
    assert post(server, "/v1/chat/completions", ok, stream)[0] == 200


@pytest.mark.parametrize("stream", [False, True])
def test_seed_range(server, stream):
    for seed in (2**63 - 1, -(2**63), 0):
        assert post(server, "/v1/completions", completion_body(seed=seed, temperature=1.0), stream)[0] == 200
    for seed in (2**63, -(2**63) - 1, 2**200):
        refused(server, "/v1/completions", completion_body(seed=seed, temperature=1.0), "seed", stream)


def test_500_is_counted_in_metrics(server, monkeypatch):
    """Both kinds of 500: an engine failure (an APIError) and an unexpected exception in a handler
    (answered by Starlette's outermost layer, outside the other middleware)."""
    metrics = server.app.state.metrics
    count = lambda: metrics.value("clover_http_responses_total", code="500")  # noqa: E731
    before = count()
    status, _, _ = raw(server, "POST", "/v1/chat/completions",
                       chat_body(messages=[{"role": "user", "content": "EXPLODE"}]))
    assert status == 500 and count() == before + 1

    def broken(*args):
        raise RuntimeError("unexpected")

    monkeypatch.setattr("clover.serving.app.chat_prompt", broken)
    status, _, body = raw(server, "POST", "/v1/chat/completions", chat_body())
    assert status == 500 and "unexpected" not in json.dumps(body)
    assert_error_shape(body, "server_error")
    assert count() == before + 2
    status, _, text = raw(server, "GET", "/metrics")
    assert status == 200 and f'clover_http_responses_total{{code="500"}} {before + 2}' in text


@pytest.mark.parametrize("stream", [False, True])
def test_empty_stop_string_stops_nothing(server, stream):
    for stop in ("", [""], ["", "nowhere"]):
        status, parsed = post(server, "/v1/completions", completion_body(stop=stop), stream)
        assert status == 200
        if stream:
            text = "".join(c["choices"][0]["text"] for c in parsed if c["choices"])
            reason = [c["choices"][0]["finish_reason"] for c in parsed if c["choices"]][-1]
        else:
            text, reason = parsed["choices"][0]["text"], parsed["choices"][0]["finish_reason"]
        assert text.endswith("The answer is 4.") and reason == "stop", (stop, text, reason)


@pytest.mark.parametrize("stream", [False, True])
def test_unsupported_content_and_response_format_are_refused(server, stream):
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    body = chat_body(messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}, image]}])
    refused(server, "/v1/chat/completions", body, "messages.0.content.1.type", stream, "image_url")
    body = chat_body(messages=[{"role": "user", "content": [{"type": "text"}]}])
    refused(server, "/v1/chat/completions", body, "messages.0.content.0.text", stream)
    for fmt, param in (({"type": "json_schema", "json_schema": {"name": "x"}}, "response_format.json_schema.schema"),
                       ({}, "response_format.type"), ({"type": "xml"}, "response_format.type")):
        refused(server, "/v1/chat/completions", chat_body(response_format=fmt), param, stream)
        refused(server, "/v1/completions", completion_body(response_format=fmt), param, stream)
    assert post(server, "/v1/chat/completions", chat_body(response_format={"type": "text"}), stream)[0] == 200
    parts = chat_body(messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    assert post(server, "/v1/chat/completions", parts, stream)[0] == 200


@pytest.mark.parametrize("field,value", [
    ("max_tokens", "5"), ("max_tokens", True), ("max_tokens", 5.5), ("temperature", "0.5"),
    ("temperature", False), ("stream", "true"), ("stream", 1), ("seed", "7"), ("top_k", 2.0),
    ("stream_options", {"include_usage": "yes"}), ("n", True), ("stop", 5),
])
def test_types_are_not_coerced(server, field, value):
    for path, body in (("/v1/chat/completions", chat_body()), ("/v1/completions", completion_body())):
        status, _, parsed = raw(server, "POST", path, {**body, field: value})
        assert status == 400, (field, value, parsed)
        assert parsed["error"]["param"].startswith(field)


def test_nan_and_infinity_are_refused(server):
    for value in ("NaN", "Infinity", "-Infinity"):
        for field in ("temperature", "threshold", "repetition_penalty", "top_p"):
            body = json.dumps(chat_body()).replace('"max_tokens": 40', f'"max_tokens": 40, "{field}": {value}')
            status, _, parsed = raw(server, "POST", "/v1/chat/completions", body)
            assert status == 400 and parsed["error"]["param"] == field, (field, value, parsed)


def test_client_chat_templates_are_refused(server):
    evil = "{% for i in range(3000) %}{% for j in range(3000) %}x{% endfor %}{% endfor %}"
    for stream in (False, True):
        refused(server, "/v1/chat/completions", chat_body(chat_template_kwargs={"chat_template": evil}),
                "chat_template_kwargs.chat_template", stream, "chat templates are not accepted")
    for key in ("tools", "add_generation_prompt", "tokenize", "messages", "documents"):
        refused(server, "/v1/chat/completions", chat_body(chat_template_kwargs={key: True}),
                f"chat_template_kwargs.{key}")
    for value in ({"a": 1}, [1, 2]):  # plain values only
        status, _, parsed = raw(server, "POST", "/v1/chat/completions",
                                chat_body(chat_template_kwargs={"enable_thinking": value}))
        assert status == 400 and parsed["error"]["param"].startswith("chat_template_kwargs")
    body = chat_body(chat_template_kwargs={"enable_thinking": False, "custom_flag": "x"})
    assert post(server, "/v1/chat/completions", body)[1]["choices"][0]["message"]["content"] == "The answer is 4."


class SpyTokenizer:
    """A tokenizer whose `encode` must not be called (the prompt is refused before)."""

    def __init__(self, tok):
        self.tok = tok

    def __getattr__(self, name):
        return getattr(self.tok, name)

    def encode(self, *args, **kwargs):
        raise AssertionError("the prompt was tokenized")


def test_oversized_prompt_is_refused_by_bytes_before_tokenizing(tok, server):
    spy = SpyTokenizer(tok)
    limit = max_prompt_bytes(tok, 4096)
    big = "x" * (limit + 1)
    req = CompletionRequest(model=MODEL, prompt=big)
    with pytest.raises(Exception, match="not tokenized"):
        completion_prompt(spy, req, 4096)
    req = ChatCompletionRequest(model=MODEL, messages=[{"role": "user", "content": big}])
    with pytest.raises(Exception, match="not tokenized"):
        chat_prompt(spy, req, 4096)
    # the bound never refuses what could fit: the longest token, repeated to the context length
    longest = max((t for t in tok.get_vocab() if "<|" not in t), key=len)
    text = tok.convert_tokens_to_string([longest]) * 4096
    assert len(text.encode()) <= limit
    for stream in (False, True):
        error = refused(server, "/v1/completions", completion_body(prompt=big), "prompt", stream)
        assert error["code"] == "context_length_exceeded" and str(limit) in error["message"]
        body = chat_body(messages=[{"role": "user", "content": big}])
        assert refused(server, "/v1/chat/completions", body, "messages", stream)["code"] == "context_length_exceeded"


def test_tokenization_runs_off_the_event_loop(tok):
    """While one request's tokenization is held, /health and other requests are still answered."""
    held, release = threading.Event(), threading.Event()
    gated = make_tokenizer()
    encode = gated.encode

    def slow_encode(text, *args, **kwargs):
        if "HOLD" in text:
            held.set()
            release.wait(timeout=60)
        return encode(text, *args, **kwargs)

    gated.encode = slow_encode
    model = ScriptedModel(gated, scripted_answer)
    app = create_app(ServerConfig(served_model_name=MODEL),
                     lambda metrics: Runtime.from_objects(model, gated, EngineConfig(num_threads=1), metrics))
    srv = ServerThread(app).start()
    try:
        wait_ready(client_for(srv))
        results = []
        worker = threading.Thread(target=lambda: results.append(
            raw(srv, "POST", "/v1/completions", completion_body(prompt="HOLD on"))[0]))
        worker.start()
        assert held.wait(timeout=60)
        assert raw(srv, "GET", "/health")[0] == 200  # would hang if encode ran on the loop
        assert raw(srv, "POST", "/v1/completions", completion_body())[0] == 200
        release.set()
        worker.join(timeout=60)
        assert results == [200]
    finally:
        release.set()
        srv.stop()


def test_metrics_need_the_key_and_docs_are_off(tok, server):
    assert raw(server, "GET", "/metrics", key=None)[0] == 401
    assert raw(server, "GET", "/metrics", key="wrong")[0] == 401
    assert raw(server, "GET", "/metrics")[0] == 200
    assert raw(server, "GET", "/health", key=None)[0] == 200
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert raw(server, "GET", path)[0] == 404
    model = ScriptedModel(tok, scripted_answer)
    app = create_app(ServerConfig(served_model_name=MODEL, docs=True),
                     lambda metrics: Runtime.from_objects(model, tok, EngineConfig(num_threads=1), metrics))
    srv = ServerThread(app).start()
    try:
        status, _, spec = raw(srv, "GET", "/openapi.json")
        assert status == 200 and "/v1/chat/completions" in spec["paths"]
        assert raw(srv, "GET", "/docs")[0] == 200
    finally:
        srv.stop()


def closed_by_server(sock: socket.socket, timeout: float = 30) -> bool:
    """True once the server closes `sock` (reads drain any response first)."""
    sock.settimeout(timeout)
    try:
        while sock.recv(4096):
            pass
    except socket.timeout:
        return False
    except ConnectionResetError:
        pass
    return True


@pytest.fixture(scope="module")
def strict_server(tok):
    """Short head/body/keep-alive timeouts and room for three connections."""
    model = ScriptedModel(tok, scripted_answer)
    app = create_app(ServerConfig(served_model_name=MODEL, body_timeout_s=0.5),
                     lambda metrics: Runtime.from_objects(model, tok, EngineConfig(num_threads=1), metrics))
    srv = ServerThread(app, ConnectionLimits(head_timeout_s=0.5, keep_alive_s=1, max_connections=3)).start()
    wait_ready(client_for(srv))
    yield srv
    srv.stop()


def test_idle_and_slow_header_connections_are_closed(strict_server):
    idle = socket.create_connection(("127.0.0.1", strict_server.port))
    slow = socket.create_connection(("127.0.0.1", strict_server.port))
    slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # the head never ends
    assert closed_by_server(idle) and closed_by_server(slow)
    kept = socket.create_connection(("127.0.0.1", strict_server.port))  # after a response: keep-alive ends
    kept.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert closed_by_server(kept)
    for s in (idle, slow, kept):
        s.close()
    assert raw(strict_server, "GET", "/health")[0] == 200


def test_slow_body_is_408(strict_server):
    sock = socket.create_connection(("127.0.0.1", strict_server.port))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 100\r\n\r\n{\"model\": ")  # 90 bytes never come
    sock.settimeout(30)
    reply = b""
    while b"\r\n\r\n" not in reply:
        reply += sock.recv(4096)
    assert reply.startswith(b"HTTP/1.1 408")
    sock.close()


def test_connection_limit_answers_503(strict_server):
    held = [socket.create_connection(("127.0.0.1", strict_server.port)) for _ in range(3)]
    try:
        status = raw(strict_server, "GET", "/health")[0]
        assert status == 503
    finally:
        for s in held:
            s.close()
    deadline = time.time() + 30
    while raw(strict_server, "GET", "/health")[0] != 200:  # the server notices the closed sockets
        assert time.time() < deadline
        time.sleep(0.05)


def test_shutdown_drain_is_limited(tok):
    """A request that never finishes does not hold the shutdown past `shutdown_timeout_s`."""
    from serve_fixtures import GatedModel
    from test_serving_errors import wait_for

    model = GatedModel(tok)
    app = create_app(ServerConfig(served_model_name=MODEL),
                     lambda metrics: Runtime.from_objects(model, tok, EngineConfig(num_threads=1), metrics))
    srv = ServerThread(app, ConnectionLimits(shutdown_timeout_s=1)).start()
    try:
        model.gate.set()
        wait_ready(client_for(srv))
        model.gate.clear()  # from now on every forward waits (up to 60 s)
        worker = threading.Thread(target=lambda: raw(srv, "POST", "/v1/completions", completion_body()),
                                  daemon=True)
        worker.start()
        wait_for(lambda: app.state.slot.runtime.engine.scheduler.num_running == 1)
        srv.server.should_exit = True
        srv.thread.join(timeout=40)
        assert not srv.thread.is_alive()  # the drain gave up after 1 s, long before the gate's 60 s
    finally:
        model.gate.set()
        srv.stop()
