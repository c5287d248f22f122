"""The server through the official `openai` client, over a tiny random model on a free loopback
port: chat and text completions, streaming with usage, 32 concurrent requests equal to the same
requests run alone (C4), a client leaving mid-stream, stop strings, metrics and the request log."""

import http.client
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from clover.serving import EngineConfig, SchedulerConfig, ServerConfig
from serve_fixtures import make_model, make_tokenizer, serve_model

MODEL = "tiny-clover"
WORDS = ["hello", "world", "Paris", "weather", "quick", "brown", "fox", "lazy", "dog", "thank"]


@pytest.fixture(scope="module")
def server():
    tok = make_tokenizer()
    srv = serve_model(make_model(tok), tok, ServerConfig(served_model_name=MODEL),
                      EngineConfig(SchedulerConfig(max_batch_size=64, max_queue=128), num_threads=1))
    yield srv, srv.client, srv.app
    srv.stop()


def chat(client, content, **kw):
    kw.setdefault("max_tokens", 8)
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], **kw)


def test_models_and_health(server):
    srv, client, _ = server
    assert [m.id for m in client.models.list().data] == [MODEL]
    conn = http.client.HTTPConnection("127.0.0.1", srv.port)
    conn.request("GET", "/health")
    assert conn.getresponse().status == 200


def test_chat_completion(server):
    _, client, _ = server
    r = chat(client, "hello world", max_tokens=6, extra_body={"block_size": 4})
    choice = r.choices[0]
    assert r.object == "chat.completion" and r.model == MODEL and r.id.startswith("chatcmpl-")
    assert choice.finish_reason in ("stop", "length") and choice.message.role == "assistant"
    assert 0 < r.usage.completion_tokens <= 6 and r.usage.prompt_tokens > 2
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    if choice.finish_reason == "length":
        assert r.usage.completion_tokens == 6
    # max_completion_tokens is honoured the same way
    r2 = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello world"}],
                                        max_completion_tokens=6, extra_body={"block_size": 4})
    assert r2.choices[0].message.content == choice.message.content


def test_text_completion(server):
    _, client, _ = server
    r = client.completions.create(model=MODEL, prompt="The quick brown", max_tokens=5)
    assert r.object == "text_completion" and r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 5
    ids = client.completions.create(model=MODEL, prompt=[17, 40, 41, 60], max_tokens=4, temperature=0)
    assert ids.usage.prompt_tokens == 4


def test_streaming_with_usage(server):
    _, client, _ = server
    plain = chat(client, "quick brown fox", max_tokens=12, extra_body={"block_size": 4})
    chunks = list(chat(client, "quick brown fox", max_tokens=12, stream=True,
                       stream_options={"include_usage": True}, extra_body={"block_size": 4}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == plain.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    blocks = -(-plain.usage.completion_tokens // 4)
    assert len([c for c in chunks if c.choices]) >= blocks + 1  # role chunk, a chunk per block, final


def test_raw_sse_framing(server):
    srv, _, _ = server
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 4, "stream": True}
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("content-type").startswith("text/event-stream")
    events = [e for e in resp.read().decode().split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2][6:])["choices"][0]["finish_reason"] in ("stop", "length")


def test_concurrent_requests_equal_single(server):
    """32 concurrent requests (mixed block sizes, prompt lengths, streaming or not) each return
    exactly what the same request returns when it runs alone."""
    _, client, _ = server
    requests = [(" ".join(WORDS[i % 10:i % 10 + 1 + i % 4]), [4, 8][i % 2], 4 + i % 9) for i in range(32)]

    def one(args, stream=False):
        prompt, block, max_tokens = args
        if stream:
            chunks = chat(client, prompt, max_tokens=max_tokens, stream=True, extra_body={"block_size": block})
            return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return chat(client, prompt, max_tokens=max_tokens, extra_body={"block_size": block}).choices[0].message.content

    alone = [one(r) for r in requests]
    with ThreadPoolExecutor(32) as pool:
        together = list(pool.map(lambda i: one(requests[i], stream=i % 3 == 0), range(32)))
    assert together == alone


def aborts(app, endpoint: str) -> float:
    return app.state.metrics.value("clover_requests_total", endpoint=endpoint, finish_reason="abort")


def test_client_disconnect_mid_stream(server):
    srv, client, app = server
    engine = app.state.slot.runtime.engine
    aborted = aborts(app, "chat")
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2000,
            "block_size": 2, "threshold": 1.0, "stream": True, "n": 2}  # both choices are freed
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    resp.fp.readline()  # the first event has arrived: the request is running
    conn.sock.close()
    conn.close()
    deadline = time.time() + 30
    while engine.scheduler.num_running or aborts(app, "chat") < aborted + 2:
        assert time.time() < deadline, "the server kept decoding for a client that left"
        time.sleep(0.05)
    assert chat(client, "hello", max_tokens=4).choices[0].finish_reason in ("stop", "length")


def test_client_disconnect_while_waiting(server):
    """A non-streaming client that leaves is noticed while its request runs, and freed."""
    srv, client, app = server
    engine = app.state.slot.runtime.engine
    aborted = aborts(app, "completions")
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 2000, "block_size": 2, "threshold": 1.0}
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    deadline = time.time() + 30
    while not engine.scheduler.num_running:
        assert time.time() < deadline
        time.sleep(0.01)
    conn.sock.close()
    while engine.scheduler.num_running or aborts(app, "completions") == aborted:
        assert time.time() < deadline, "the server kept decoding for a client that left"
        time.sleep(0.05)


def test_stop_string(server):
    _, client, _ = server
    full = client.completions.create(model=MODEL, prompt="hello", max_tokens=16, extra_body={"block_size": 4})
    text = full.choices[0].text
    cut = text[3:5]
    if not cut:
        pytest.skip("the random model produced too little text")
    stopped = client.completions.create(model=MODEL, prompt="hello", max_tokens=16, stop=[cut],
                                        extra_body={"block_size": 4})
    assert stopped.choices[0].text == text[:text.index(cut)]
    assert stopped.choices[0].finish_reason == "stop"


def test_metrics_and_request_log(server, caplog):
    srv, client, _ = server
    with caplog.at_level(logging.INFO, logger="clover.serve"):
        r = chat(client, "thank you", max_tokens=4)
    lines = [rec.getMessage() for rec in caplog.records if r.id in rec.getMessage()]
    assert len(lines) == 1 and "completion_tokens=" in lines[0] and "forwards=" in lines[0]
    assert "latency=" in lines[0]
    conn = http.client.HTTPConnection("127.0.0.1", srv.port)
    conn.request("GET", "/metrics")
    resp = conn.getresponse()
    text = resp.read().decode()
    assert resp.status == 200 and resp.getheader("content-type").startswith("text/plain")
    for name in ("clover_requests_total", "clover_queue_depth", "clover_generation_tokens_total",
                 "clover_forward_passes_total", "clover_request_tokens_per_forward_bucket",
                 "clover_request_latency_seconds_bucket", "clover_time_to_first_block_seconds_count"):
        assert name in text, name
    forwards = next(line for line in text.splitlines() if line.startswith("clover_forward_passes_total "))
    assert float(forwards.split()[1]) > 0
    conn.request("GET", "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    resp = conn.getresponse()
    assert resp.getheader("content-type").startswith("application/openmetrics-text")
    assert resp.read().decode().endswith("# EOF\n")
