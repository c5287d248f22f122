"""`response_format` over HTTP: json_schema output validates even from a RANDOM-weight model (every
choice, streamed or not), json_object from the embedded model parses, a bad schema is a 400 that
names the problem while the server keeps serving, and free-text requests are unchanged."""

import json

import jsonschema
import openai
import pytest
import torch

import clover
from clover.data import get_task
from clover.data.tokenizer import load_tokenizer
from clover.loading import load_model
from clover.serving import EngineConfig, Runtime, ServerConfig, create_app
from serve_fixtures import ServerThread, wait_ready
from tiny import tiny_model

MODEL = "clover-structured"
TIME = {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"}
ZONES = {  # bounded strings and numbers: any model's output ends within the token budget
    "type": "array", "minItems": 1, "maxItems": 3,
    "items": {
        "type": "object",
        "properties": {"id": {"type": "string", "pattern": "^Z[0-9]{2}$"},
                       "location": {"enum": ["Old Town", "Sea Wall"]},
                       "radius_km": {"type": "integer", "minimum": 1, "maximum": 8}, "start": TIME, "end": TIME},
        "required": ["id", "location", "radius_km", "start", "end"],
        "additionalProperties": False,
    },
}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "zones", "strict": True, "schema": ZONES}}
GREEDY = dict(temperature=0, presence_penalty=0.0, frequency_penalty=0.0, extra_body={"repetition_penalty": 1.0})


def serve(model, tok):
    app = create_app(ServerConfig(served_model_name=MODEL),
                     lambda metrics: Runtime.from_objects(model, tok, EngineConfig(num_threads=1), metrics))
    srv = ServerThread(app).start()
    client = openai.OpenAI(api_key="unused", base_url=srv.base_url + "/v1", max_retries=0, timeout=120)
    wait_ready(client)
    return srv, client


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(clover.default_model_dir())


@pytest.fixture(scope="module")
def random_client(tok):
    """A random-weight model over the embedded tokenizer (scaled head: several fills per step)."""
    model = tiny_model(seed=3, vocab_size=len(tok), mask_token_id=tok.mask_token_id)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    srv, client = serve(model, tok)
    yield client
    srv.stop()


def chat(client, content: str, **kw):
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}],
                                          max_tokens=192, **kw)


def test_json_schema_choices_validate_with_a_random_model(random_client):
    zones = 0
    for content in ("Read the notices.", "NOTICE Z12: no-fly zone at Old Town"):
        out = chat(random_client, content, response_format=JSON_SCHEMA, n=3, temperature=1.3, seed=5,
                   extra_body={"block_size": 8, "threshold": 0.6})
        for choice in out.choices:
            assert choice.finish_reason == "stop", choice.message.content
            answer = json.loads(choice.message.content)
            jsonschema.validate(answer, ZONES)
            zones += len(answer)
    assert zones >= 3  # not only empty lists


def test_streamed_completion_validates(random_client):
    stream = random_client.completions.create(model=MODEL, prompt="NOTICE Z40", max_tokens=192, stream=True,
                                              extra_body={"block_size": 8, "response_format": JSON_SCHEMA},
                                              temperature=1.0, seed=2)
    chunks = list(stream)
    assert chunks[-1].choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads("".join(c.choices[0].text for c in chunks)), ZONES)


def test_free_text_requests_are_unchanged(random_client):
    plain = chat(random_client, "hello", **GREEDY)
    text = chat(random_client, "hello", response_format={"type": "text"}, **GREEDY)
    assert plain.choices[0].message.content == text.choices[0].message.content
    constrained = chat(random_client, "hello", response_format=JSON_SCHEMA, **GREEDY)
    assert constrained.choices[0].message.content != plain.choices[0].message.content


@pytest.mark.parametrize("fmt,param,words", [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}},
     "response_format.json_schema.schema", "nonsense"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(["}}},
     "response_format.json_schema.schema", "unclosed"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nowhere"}}},
     "response_format.json_schema.schema", "nowhere"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}, "response_format.json_schema.schema",
     "must be a JSON schema object"),
    ({"type": "yaml"}, "response_format.type", "'yaml'"),
])
def test_bad_schema_is_a_400_naming_the_problem(random_client, fmt, param, words):
    with pytest.raises(openai.BadRequestError) as e:
        chat(random_client, "hi", response_format=fmt)
    error = e.value.body
    assert error["param"] == param and words in error["message"], error
    assert chat(random_client, "hi", response_format=JSON_SCHEMA).choices[0].finish_reason == "stop"


def test_json_object_from_the_embedded_model(tok):
    """Every finished answer is one JSON object. (The embedded model answers airspace notices with a
    JSON list; forced to open an object it may lose its way and run to max_tokens, so only the
    finished answers are checked, and at least one must finish.)"""
    srv, client = serve(load_model(clover.default_model_dir()), tok)
    try:
        finished = 0
        for seed in (7, 3, 11):
            notices = get_task("airspace").generate(seed=seed, split="eval").prompt
            out = chat(client, notices, response_format={"type": "json_object"}, max_completion_tokens=128,
                       extra_body={"enable_thinking": False})
            if out.choices[0].finish_reason == "stop":
                finished += 1
                assert isinstance(json.loads(out.choices[0].message.content), dict)
        assert finished
    finally:
        srv.stop()
