"""`/tokenize` and `/detokenize` as vLLM has them: prompt or chat messages in, ids, count and
max_model_len out; ids back to text; behind the API key; clear 400s."""

import pytest

from clover.serving import ServerConfig
from serve_fixtures import serve_scripted
from test_serving_errors import assert_error_shape, raw

MODEL = "scripted"
KEY = "sk-tokenize"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the weather?"}]


@pytest.fixture(scope="module")
def server(tok):
    srv = serve_scripted(tok, ServerConfig(served_model_name=MODEL, api_key=KEY))
    yield srv
    srv.stop()


def post(srv, path, body, key=KEY):
    status, _, parsed = raw(srv, "POST", path, body, key=key)
    return status, parsed


def test_tokenize_a_prompt_and_detokenize_it_back(server, tok):
    text = "hello world, how are you today?"
    status, body = post(server, "/tokenize", {"model": MODEL, "prompt": text, "return_token_strs": True})
    assert status == 200
    assert body["tokens"] == tok.encode(text) and body["count"] == len(body["tokens"])
    assert body["max_model_len"] == server.app.state.slot.runtime.max_model_len
    assert body["token_strs"] == tok.convert_ids_to_tokens(body["tokens"])
    status, back = post(server, "/detokenize", {"model": MODEL, "tokens": body["tokens"]})
    assert status == 200 and back == {"prompt": text}
    status, plain = post(server, "/tokenize", {"prompt": text})  # `model` is optional, as in vLLM
    assert status == 200 and plain["tokens"] == body["tokens"] and plain["token_strs"] is None


def test_tokenized_messages_are_the_prompt_chat_completions_feed(server, tok):
    status, body = post(server, "/tokenize", {"model": MODEL, "messages": MESSAGES})
    assert status == 200
    status, _, chat = raw(server, "POST", "/v1/chat/completions", {"model": MODEL, "messages": MESSAGES,
                                                                   "max_tokens": 8}, key=KEY)
    assert status == 200 and chat["usage"]["prompt_tokens"] == body["count"]
    rendered = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert body["tokens"] == tok.encode(rendered, add_special_tokens=False)
    status, back = post(server, "/detokenize", {"tokens": body["tokens"]})
    assert back["prompt"] == rendered  # special tokens (<|im_start|> ...) are kept
    status, bare = post(server, "/tokenize", {"messages": MESSAGES, "add_generation_prompt": False})
    assert status == 200 and bare["count"] < body["count"] and body["tokens"][:bare["count"]] == bare["tokens"]
    prefill = MESSAGES + [{"role": "assistant", "content": "It is"}]
    status, open_ = post(server, "/tokenize", {"messages": prefill, "add_generation_prompt": False,
                                               "continue_final_message": True})
    assert status == 200 and tok.decode(open_["tokens"], skip_special_tokens=False).endswith("It is")


@pytest.mark.parametrize("path,body,param,says", [
    ("/detokenize", {"tokens": [5, 300]}, "tokens.1", ["300", "vocabulary size 300"]),
    ("/detokenize", {"tokens": [-1]}, "tokens.0", ["-1", "vocabulary size 300"]),
    ("/detokenize", {"tokens": ["5"]}, "tokens.0", []),
    ("/detokenize", {}, "tokens", []),
    ("/tokenize", {"prompt": "hi", "messages": MESSAGES}, None, ["exactly one of 'prompt'"]),
    ("/tokenize", {"model": MODEL}, None, ["exactly one of 'prompt'"]),
    ("/tokenize", {"messages": MESSAGES, "continue_final_message": True}, None, ["cannot both be true"]),
    ("/tokenize", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages.0.content.0.type", ["only 'text'"]),
    ("/tokenize", {"prompt": 5}, "prompt", []),
])
def test_bad_input_is_a_clear_400(server, path, body, param, says):
    status, error = post(server, path, body)
    assert status == 400, error
    assert_error_shape(error, "invalid_request_error")
    assert error["error"]["param"] == param
    assert all(s in error["error"]["message"] for s in says), error


def test_wrong_model_is_404_and_the_key_is_required(server):
    status, error = post(server, "/tokenize", {"model": "gpt-4", "prompt": "hi"})
    assert status == 404 and error["error"]["code"] == "model_not_found"
    for path, body in (("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": [1]})):
        assert post(server, path, body, key=None)[0] == 401
        assert post(server, path, body, key="sk-wrong")[0] == 401
