"""OpenAI `logprobs` / `top_logprobs` (chat) and `logprobs` (completions), and `n > 1` choices.

A block-diffusion token's logprob is the one it was committed with: taken from the denoising step
that filled its position, not recomputed later (checked on `RowDecoder` with hand-made logits)."""

import math

import openai
import pytest
import torch

from clover.serving import EngineConfig, Runtime, SchedulerConfig, ServerConfig, create_app
from clover.serving.denoise import RowDecoder
from serve_fixtures import ServerThread, make_model, make_tokenizer, wait_ready

MODEL = "tiny-clover"


@pytest.fixture(scope="module")
def tok_model():
    tok = make_tokenizer()
    return tok, make_model(tok)


@pytest.fixture(scope="module")
def client(tok_model):
    tok, model = tok_model
    config = EngineConfig(SchedulerConfig(max_batch_size=16, max_queue=64), num_threads=1)
    app = create_app(ServerConfig(served_model_name=MODEL),
                     lambda metrics: Runtime.from_objects(model, tok, config, metrics))
    srv = ServerThread(app).start()
    client = openai.OpenAI(api_key="unused", base_url=srv.base_url + "/v1", max_retries=0, timeout=120)
    wait_ready(client)
    yield client
    srv.stop()


def test_logprob_is_the_one_the_token_was_committed_with(tok_model):
    tok, model = tok_model
    from clover.model.generation_config import DecodeConfig

    cfg = DecodeConfig(block_size=4, threshold=0.9, max_new_tokens=4, eos_token_id=(0,), repetition_penalty=1.0,
                       presence_penalty=0.0, frequency_penalty=0.0, dllm_length_penalty=0.0)
    decoder = RowDecoder.start(model, tok("hello world").input_ids, cfg, top_logprobs=2)
    vocab, mask = model.config.vocab_size, tok.mask_token_id
    block = torch.full((4,), mask, dtype=torch.long)
    logits = torch.zeros(4, vocab)
    logits[1, 100] = 12.0  # position 1 passes the threshold; the others are flat
    block = decoder.step(logits, block, 0, 4, None)
    assert block.tolist()[1] == 100 and (block == mask).sum() == 3
    flat = logits[1].clone()
    flat[mask] = float("-inf")
    first = flat.log_softmax(-1)[100].item()
    assert decoder.block_logprobs[1][0] == pytest.approx(first, abs=1e-5)
    assert decoder.block_logprobs[1][1][0] == (100, pytest.approx(first, abs=1e-5))
    later = torch.zeros(4, vocab)
    later[:, 150] = 20.0  # every masked position now fills with 150; position 1 keeps its first logprob
    block = decoder.step(later, block, 0, 4, None)
    assert block.tolist() == [150, 100, 150, 150]
    taken = decoder.take_logprobs(4)
    assert taken[1][0] == pytest.approx(first, abs=1e-5)
    expected = later[0].clone()
    expected[mask] = float("-inf")
    assert taken[0][0] == pytest.approx(expected.log_softmax(-1)[150].item(), abs=1e-5)
    assert len(taken[0][1]) == 2 and decoder.block_logprobs == {}


def test_chat_logprobs_and_top_logprobs(client):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello world"}],
                                       max_tokens=12, temperature=0, logprobs=True, top_logprobs=3,
                                       extra_body={"block_size": 4})
    content = r.choices[0].logprobs.content
    assert 0 < len(content) <= r.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        values = [t.logprob for t in entry.top_logprobs]
        assert values == sorted(values, reverse=True)
        assert entry.logprob == pytest.approx(values[0], abs=1e-5)  # greedy: the committed token is the top one
        assert entry.token == entry.top_logprobs[0].token and bytes(entry.bytes).decode() == entry.token
    plain = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello world"}],
                                           max_tokens=12, temperature=0, extra_body={"block_size": 4})
    assert plain.choices[0].logprobs is None
    assert plain.choices[0].message.content == r.choices[0].message.content


def test_completion_logprobs(client):
    r = client.completions.create(model=MODEL, prompt="The quick brown", max_tokens=10, temperature=0,
                                  logprobs=2, echo=True, extra_body={"block_size": 4})
    choice = r.choices[0]
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) > 0
    assert choice.text == "The quick brown" + "".join(lp.tokens)
    assert lp.text_offset[0] == len("The quick brown")
    assert all(b - a == len(t) for a, b, t in zip(lp.text_offset, lp.text_offset[1:], lp.tokens))
    assert all(v <= 0 and len(top) <= 2 and math.isclose(max(top.values()), v, abs_tol=1e-5)
               for v, top in zip(lp.token_logprobs, lp.top_logprobs))


def test_n_choices_are_the_single_requests_with_seeds_seed_plus_i(client):
    body = dict(model=MODEL, prompt="hello", max_tokens=8, temperature=1.0, extra_body={"block_size": 4})
    r = client.completions.create(**body, n=3, seed=5)
    assert [c.index for c in r.choices] == [0, 1, 2]
    singles = [client.completions.create(**body, seed=5 + i) for i in range(3)]
    assert [c.text for c in r.choices] == [s.choices[0].text for s in singles]
    assert [c.finish_reason for c in r.choices] == [s.choices[0].finish_reason for s in singles]
    assert r.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)
    assert r.usage.prompt_tokens == singles[0].usage.prompt_tokens
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], n=2,
                                          max_tokens=6, seed=1, logprobs=True)
    assert [c.index for c in chat.choices] == [0, 1] and all(c.logprobs.content is not None for c in chat.choices)
