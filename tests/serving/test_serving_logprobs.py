"""OpenAI `logprobs` / `top_logprobs` (chat) and `logprobs` (completions), and `n > 1` choices.

A block-diffusion token's logprob is the one it was committed with: taken from the denoising step
that filled its position, not recomputed later (checked on `RowDecoder` with hand-made logits)."""

import math

import openai
import pytest
import torch

from clover.serving import EngineConfig, SchedulerConfig, ServerConfig
from clover.serving.denoise import RowDecoder, prompt_logprobs
from clover.serving.output import chat_logprobs, completion_logprobs
from serve_fixtures import make_model, make_tokenizer, serve_model

MODEL = "tiny-clover"


@pytest.fixture(scope="module")
def tok_model():
    tok = make_tokenizer()
    return tok, make_model(tok)


@pytest.fixture(scope="module")
def client(tok_model):
    tok, model = tok_model
    srv = serve_model(model, tok, ServerConfig(served_model_name=MODEL),
                      EngineConfig(SchedulerConfig(max_batch_size=16, max_queue=64), num_threads=1))
    yield srv.client
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
    block = decoder.step(logits, block, 0, 4, None).block[0]
    assert block.tolist()[1] == 100 and (block == mask).sum() == 3
    flat = logits[1].clone()
    flat[mask] = float("-inf")
    first = flat.log_softmax(-1)[100].item()
    assert decoder.block_logprobs[1][0] == pytest.approx(first, abs=1e-5)
    assert decoder.block_logprobs[1][1][0] == (100, pytest.approx(first, abs=1e-5))
    later = torch.zeros(4, vocab)
    later[:, 150] = 20.0  # every masked position now fills with 150; position 1 keeps its first logprob
    block = decoder.step(later, block, 0, 4, None).block[0]
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
                                  logprobs=2, extra_body={"block_size": 4})
    choice = r.choices[0]
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) > 0
    assert lp.text_offset[0] == 0
    shown = "".join(lp.tokens)
    assert shown == choice.text or (choice.finish_reason == "stop" and shown.startswith(choice.text))  # + EOS
    assert all(b - a == len(t) for a, b, t in zip(lp.text_offset, lp.text_offset[1:], lp.tokens))
    assert all(v <= 0 and len(top) <= 2 and math.isclose(max(top.values()), v, abs_tol=1e-5)
               for v, top in zip(lp.token_logprobs, lp.top_logprobs))


def causal_logprobs(model, ids: list[int]) -> torch.Tensor:
    """Reference: log p(ids[i] | ids[:i]) for i >= 1 from one plain causal forward of the whole prompt."""
    with torch.inference_mode():
        logits = model(torch.tensor([ids]), block_len=0).logits[0].float()  # [P, V]
    return logits[:-1].log_softmax(-1).gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)  # [P - 1]


def test_echo_gives_prompt_logprobs_from_one_causal_pass(client, tok_model):
    """What lm-eval's `local-completions` sends for a loglikelihood request: token ids in a batch of
    one, echo, logprobs=1, max_tokens=1; it reads token_logprobs[ctxlen:-1]."""
    tok, model = tok_model
    ids = tok("The quick brown fox jumps over the lazy dog.").input_ids
    r = client.completions.create(model=MODEL, prompt=[ids], max_tokens=1, temperature=0, logprobs=1,
                                  echo=True, seed=1234)
    choice, lp = r.choices[0], r.choices[0].logprobs
    assert len(lp.tokens) == len(ids) + 1  # every prompt token, then the generated one (EOS or not)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    expected = causal_logprobs(model, ids)
    assert lp.token_logprobs[1:len(ids)] == pytest.approx(expected.tolist(), rel=1e-5, abs=1e-4)
    for value, top, token in zip(lp.token_logprobs[1:], lp.top_logprobs[1:], lp.tokens[1:]):
        assert len(top) == 1 and max(top.values()) >= value - 1e-5  # is_greedy as lm-eval reads it
    assert choice.text.startswith(tok.decode(ids)) and "".join(lp.tokens[:len(ids)]) == tok.decode(ids)
    assert lp.text_offset[:len(ids)] == [len("".join(lp.tokens[:i])) for i in range(len(ids))]


def test_prompt_logprobs_in_pieces_equal_one_pass(tok_model):
    tok, model = tok_model
    ids = tok("def add(x, y):\n    return x + y\n").input_ids
    with torch.inference_mode():
        whole = prompt_logprobs(model, ids, 3, chunk=512)
        pieces = prompt_logprobs(model, ids, 3, chunk=5)
    assert whole[0] is None and pieces[0] is None and len(whole) == len(pieces) == len(ids)
    assert [e[0] for e in whole[1:]] == pytest.approx(causal_logprobs(model, ids).tolist(), rel=1e-5, abs=1e-5)
    assert [e[0] for e in pieces[1:]] == pytest.approx([e[0] for e in whole[1:]], rel=1e-5, abs=1e-5)
    assert all([i for i, _ in a[1]] == [i for i, _ in b[1]] for a, b in zip(whole[1:], pieces[1:]))
    assert prompt_logprobs(model, ids[:1], 3, chunk=5) == [None]


def test_completion_logprobs_list_the_eos_that_ended_the_text_not_one_after_a_stop(tok_model):
    tok, _ = tok_model
    a, b = tok("hello").input_ids, tok(" world").input_ids
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    ids = a + b + [eos]
    entries = [(-0.5, [(t, -0.5)]) for t in ids]
    full = completion_logprobs(tok, ids, entries, {eos}, "hello world", 1)
    assert full.tokens[-1] == "<|im_end|>" and len(full.tokens) == len(ids)
    assert full.text_offset[-1] == len("hello world")
    stopped = completion_logprobs(tok, ids, entries, {eos}, "hello", 1)  # stop=" world" cut the text
    assert "".join(stopped.tokens) == "hello" and "<|im_end|>" not in stopped.tokens
    assert chat_logprobs(tok, ids, entries, {eos}, "hello world", 1).content[-1].token != "<|im_end|>"


def test_token_prompts_in_a_batch_of_one_are_served_and_echoed_as_text(client, tok_model):
    tok, _ = tok_model
    ids = tok("hello world").input_ids
    one = client.completions.create(model=MODEL, prompt=[ids], max_tokens=4, temperature=0, echo=True)
    flat = client.completions.create(model=MODEL, prompt=ids, max_tokens=4, temperature=0)
    assert one.choices[0].text == tok.decode(ids) + flat.choices[0].text
    with pytest.raises(openai.BadRequestError, match="holds 2 prompts"):
        client.completions.create(model=MODEL, prompt=[ids, ids], max_tokens=4)


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


def test_streamed_chat_logprobs_put_together_are_the_non_streamed_ones(client):
    body = dict(model=MODEL, messages=[{"role": "user", "content": "hello world"}], max_tokens=16, temperature=0,
                logprobs=True, top_logprobs=3, extra_body={"block_size": 4})
    whole = client.chat.completions.create(**body).choices[0]
    chunks = list(client.chat.completions.create(**body, stream=True))
    carrying = [ch.logprobs.content for c in chunks for ch in c.choices if ch.logprobs and ch.logprobs.content]
    assert len(carrying) > 1  # one chunk per block: the logprobs come in pieces
    streamed = [entry for content in carrying for entry in content]
    content = [entry for c in chunks for ch in c.choices if ch.delta.content for entry in [ch.delta.content]]
    assert "".join(content) == whole.message.content
    expected = whole.logprobs.content
    assert len(expected) > 4 and [e.token for e in streamed] == [e.token for e in expected]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in expected], abs=1e-5)
    assert [[t.token for t in e.top_logprobs] for e in streamed] == [[t.token for t in e.top_logprobs]
                                                                     for e in expected]
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason and chunks[-1].choices[0].logprobs is None


def test_streamed_completion_logprobs_with_echo_and_a_stop_string(client):
    plain = client.completions.create(model=MODEL, prompt="The quick brown", max_tokens=16, temperature=0,
                                      extra_body={"block_size": 4}).choices[0].text
    stop = plain[len(plain) // 2:len(plain) // 2 + 2]
    body = dict(model=MODEL, prompt="The quick brown", max_tokens=16, temperature=0, logprobs=2, echo=True,
                stop=[stop], extra_body={"block_size": 4})
    whole = client.completions.create(**body).choices[0]
    chunks = list(client.completions.create(**body, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == whole.text
    assert whole.text.startswith("The quick brown") and whole.finish_reason == "stop"
    parts = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs is not None]
    assert len(parts) > 2  # the echo's, then one per block
    assert parts[0].token_logprobs[0] is None and "".join(parts[0].tokens) == "The quick brown"  # the echo
    for field in ("tokens", "top_logprobs", "text_offset"):
        assert [x for p in parts for x in getattr(p, field)] == getattr(whole.logprobs, field), field
    streamed = [x for p in parts for x in p.token_logprobs]
    assert streamed[0] is None and streamed[1:] == pytest.approx(whole.logprobs.token_logprobs[1:], abs=1e-5)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_streamed_n_choices_are_the_non_streamed_ones(client, endpoint):
    common = dict(model=MODEL, n=2, seed=11, max_tokens=12, temperature=1.0, extra_body={"block_size": 4})
    if endpoint == "chat":
        create, body = client.chat.completions.create, dict(messages=[{"role": "user", "content": "hi"}], **common)
        piece = lambda ch: ch.delta.content or ""  # noqa: E731
        final = lambda ch: ch.message.content  # noqa: E731
    else:
        create, body = client.completions.create, dict(prompt="hello", **common)
        piece = final = lambda ch: ch.text  # noqa: E731
    whole = create(**body)
    chunks = list(create(**body, stream=True, stream_options={"include_usage": True}))
    texts, finished = {0: "", 1: ""}, {}
    for chunk in chunks[:-1]:
        assert chunk.id == chunks[0].id and chunk.usage is None
        for ch in chunk.choices:
            assert ch.index not in finished, "a chunk after its choice finished"
            texts[ch.index] += piece(ch)
            if ch.finish_reason:
                finished[ch.index] = ch.finish_reason
    assert [texts[i] for i in (0, 1)] == [final(c) for c in whole.choices] and texts[0] != texts[1]
    assert [finished[i] for i in (0, 1)] == [c.finish_reason for c in whole.choices]
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == whole.usage.model_dump()
