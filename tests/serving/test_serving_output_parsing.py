"""Response post-processing: tool calls, reasoning, stop strings, streaming deltas, metrics text."""

import json

import pytest

from clover.serving.metrics import ServingMetrics
from clover.serving.output import ChatView, ResponseText, split_reasoning, split_tool_calls

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def test_tool_calls_parsed_and_content_kept():
    split = split_tool_calls("Let me check.\n" + CALL + "\n" + CALL.replace("Paris", "Rome"), final=True)
    assert split.content.strip() == "Let me check."
    assert [c.function.name for c in split.calls] == ["get_weather", "get_weather"]
    assert [json.loads(c.function.arguments) for c in split.calls] == [{"city": "Paris"}, {"city": "Rome"}]
    assert split.calls[0].id != split.calls[1].id


def test_malformed_tool_call_stays_text():
    text = "<tool_call>\n{not json}\n</tool_call>"
    split = split_tool_calls(text, final=True)
    assert split.calls == [] and split.content == text


def test_tool_call_start_is_held_back_while_streaming():
    assert split_tool_calls("Hello <tool", final=False).content == "Hello "
    assert split_tool_calls("Hello <tool_call>\n{\"na", final=False).content == "Hello "
    assert split_tool_calls("Hello <tool", final=True).content == "Hello <tool"


@pytest.mark.parametrize("text,reasoning,content", [
    ("<think>\nStep 1.\n</think>\n\nAnswer.", "Step 1.", "Answer."),
    ("Answer only.", None, "Answer only."),
    ("<think>\nunfinished", "unfinished", ""),
])
def test_reasoning_split(text, reasoning, content):
    split = split_reasoning(text, opened_in_prompt=False, final=True)
    assert (split.reasoning, split.content) == (reasoning, content)


def test_reasoning_opened_in_prompt():
    split = split_reasoning("Step 1.\n</think>\n\nAnswer.", opened_in_prompt=True, final=True)
    assert (split.reasoning, split.content) == ("Step 1.", "Answer.")


class FakeTokenizer:
    """Token i is the i-th character of a fixed alphabet; 99 is EOS."""

    alphabet = "abcdefghijklmnopqrstuvwxyz <>/_\n{}\":,.!"

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.alphabet[i] for i in ids)

    def encode(self, text):
        return [self.alphabet.index(c) for c in text]


def test_stop_string_cuts_and_holds_back():
    tok = FakeTokenizer()
    text = ResponseText(tok, (99,), ["stop"])
    text.add(tok.encode("go on st"))
    assert text.safe(final=False) == "go on " and not text.stopped
    text.add(tok.encode("op here"))
    assert text.stopped and text.text == "go on " and text.safe(final=False) == "go on "


def test_stream_deltas_add_up_to_final_parts():
    """Whatever the block boundaries, the streamed reasoning and content equal the final ones."""
    tok = FakeTokenizer()
    full = "<think>\nhmm, ok.\n</think>\n\nsure: <tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>"
    for size in (1, 3, 7):
        text, view = ResponseText(tok, (99,), []), ChatView(False, True)
        reasoning = content = ""
        ids = tok.encode(full)
        for i in range(0, len(ids), size):
            text.add(ids[i:i + size])
            final = i + size >= len(ids)
            d_r, d_c, parts = view.delta(text.safe(final), final)
            reasoning, content = reasoning + d_r, content + d_c
        assert (reasoning, content) == (parts.reasoning, parts.content) == ("hmm, ok.", "sure: ")
        assert [c.function.name for c in parts.tool_calls] == ["f"]


def test_metrics_exposition_and_one_registry_per_app():
    m, other = ServingMetrics(), ServingMetrics()  # two apps in one process: no name collision
    m.requests.labels("chat", "stop").inc()
    m.latency.observe(0.3)
    m.queue_depth.set(3)
    text, content_type = m.render()
    text = text.decode()
    assert content_type == "text/plain; version=0.0.4; charset=utf-8"
    assert "# TYPE clover_requests_total counter" in text
    assert 'clover_requests_total{endpoint="chat",finish_reason="stop"} 1.0' in text
    assert 'clover_request_latency_seconds_bucket{le="0.25"} 0.0' in text
    assert 'clover_request_latency_seconds_bucket{le="0.5"} 1.0' in text
    assert 'clover_request_latency_seconds_bucket{le="+Inf"} 1.0' in text
    assert "clover_request_latency_seconds_count 1.0" in text
    assert "clover_queue_depth 3.0" in text
    assert m.value("clover_requests_total", endpoint="chat", finish_reason="stop") == 1
    assert other.value("clover_requests_total", endpoint="chat", finish_reason="stop") == 0
    assert "clover_queue_depth 0.0" in other.render()[0].decode()
    open_metrics, content_type = m.render("application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text") and open_metrics.endswith(b"# EOF\n")
