"""Block diffusion with fallback="causal" in the server (the engine's CHECK phase), with either fill
rule: batched requests decode exactly as `model.generate(fallback="causal", fill=...)` with the
cache pool and its plain twin, prompt pieces included; at threshold 1.0 they decode as AR; logprobs
come with every token."""

import pytest
import torch

from clover.serving.engine import Engine, EngineConfig
from clover.serving.scheduler import EngineRequest, SchedulerConfig

from serve_fixtures import drive, generate_like, new_tokens, request_settings

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = ["hello world", "The quick brown fox jumps over the lazy dog.", "What is the weather?", "def add(x, y):"]


def engine_of(model, tok, pool: bool) -> Engine:
    scheduler = SchedulerConfig(prefill_chunk=8, max_step_tokens=16, attention_tokens=None)  # prompt pieces
    return Engine(model, tok, EngineConfig(scheduler, cache_pool=pool))


@pytest.mark.parametrize("fill", ["threshold", "prefix"])
@pytest.mark.parametrize("pool", [True, False])
def test_engine_equals_generate_with_the_causal_fallback(model, tok, pool, fill):
    requests = [(f"r{i}", tok.encode(p), request_settings(model, tok, max_new_tokens=14 + i, block_size=[4, 8][i % 2],
                                                           threshold=0.8, fallback="causal", fill=fill))
                for i, p in enumerate(PROMPTS)]
    out = drive(engine_of(model, tok, pool), requests)
    for rid, ids, cfg in requests:
        assert new_tokens(out[rid]) == generate_like(model, ids, cfg), rid
    confident = drive(engine_of(model, tok, pool), [(rid, ids, request_settings(
        model, tok, max_new_tokens=cfg.max_new_tokens, block_size=cfg.block_size, threshold=0.8))
        for rid, ids, cfg in requests])
    assert any(new_tokens(confident[rid]) != new_tokens(out[rid]) for rid, _, _ in requests)


def logprob_run(engine: Engine, ids: list[int], cfg) -> tuple[list[int], list]:
    outs = []
    engine.submit(EngineRequest("a", ids, cfg, top_logprobs=2), outs.append)
    with torch.inference_mode():
        while engine.scheduler.num_running or engine.scheduler.num_waiting:
            engine.step()
    return [t for o in outs for t in o.new_token_ids], [e for o in outs for e in (o.new_logprobs or [])]


def test_threshold_one_decodes_as_ar_with_its_logprobs(model, tok):
    """Every step is a fallback: each token is AR's, reported with AR's logprob and alternatives."""
    ids = tok.encode(PROMPTS[1])
    causal = request_settings(model, tok, max_new_tokens=12, block_size=4, threshold=1.0, fallback="causal")
    ar = request_settings(model, tok, max_new_tokens=12, block_size=4, mode="ar")
    tokens, entries = logprob_run(engine_of(model, tok, True), ids, causal)
    ar_tokens, ar_entries = logprob_run(engine_of(model, tok, True), ids, ar)
    assert tokens == ar_tokens == generate_like(model, ids, ar) and len(entries) == len(tokens)
    for (logprob, alternatives), (ar_logprob, ar_alternatives) in zip(entries, ar_entries):
        assert logprob == pytest.approx(ar_logprob, abs=1e-4)
        assert [i for i, _ in alternatives] == [i for i, _ in ar_alternatives]


def test_prefix_fill_with_the_causal_pass_reports_a_logprob_per_token(model, tok):
    """fill="prefix": a step's confident run takes its logprobs from the block-mode step, the
    positions the causal pass then writes from the causal pass; every token has its entry."""
    ids = tok.encode(PROMPTS[3])
    cfg = request_settings(model, tok, max_new_tokens=16, block_size=8, threshold=0.7, fallback="causal",
                           fill="prefix")
    tokens, entries = logprob_run(engine_of(model, tok, True), ids, cfg)
    assert tokens == generate_like(model, ids, cfg) and len(entries) == len(tokens)


def test_http_fallback_and_fill_fields_and_a_bad_value_is_a_400(model, tok):
    """The request fields `fallback` and `fill` reach the engine (greedy text equals
    `model.generate`'s); an unknown value is a 400 naming the field and the choices, and the server
    goes on serving."""
    import openai

    from clover.serving import ServerConfig
    from serve_fixtures import serve_model

    srv = serve_model(model, tok, ServerConfig())
    try:
        ids = tok.encode(PROMPTS[2])
        extra = {"block_size": 4, "threshold": 0.8, "fallback": "causal", "fill": "prefix"}
        got = srv.client.completions.create(model="clover", prompt=ids, temperature=0, max_tokens=12,
                                            extra_body=extra)
        cfg = request_settings(model, tok, max_new_tokens=12, block_size=4, threshold=0.8, fallback="causal",
                               fill="prefix")
        expected = [t for t in generate_like(model, ids, cfg) if t not in cfg.eos_token_id]
        assert got.choices[0].text == tok.decode(expected)
        with pytest.raises(openai.BadRequestError) as bad:
            srv.client.completions.create(model="clover", prompt="hi", max_tokens=4, extra_body={"fallback": "left"})
        assert bad.value.body["param"] == "fallback"
        assert "'left'" in bad.value.body["message"] and "causal" in bad.value.body["message"]
        with pytest.raises(openai.BadRequestError) as bad:
            srv.client.completions.create(model="clover", prompt="hi", max_tokens=4, extra_body={"fill": "left"})
        assert bad.value.body["param"] == "fill"
        assert "'left'" in bad.value.body["message"] and "prefix" in bad.value.body["message"]
        ok = srv.client.completions.create(model="clover", prompt="hi", max_tokens=4, extra_body=extra)
        assert ok.usage.completion_tokens > 0
    finally:
        srv.stop()

