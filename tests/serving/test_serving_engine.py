"""Engine and scheduler without HTTP: batch independence (C4), agreement with `model.generate`,
cache stacking, admission bounds, aborts."""

import pytest
import torch

from clover.serving.cache import split_cache, stack_caches
from clover.serving.engine import Engine, EngineConfig
from clover.serving.scheduler import EngineRequest, Phase, QueueFullError, SchedulerConfig

from serve_fixtures import drive, new_tokens, request_settings

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = ["hello world", "The quick brown fox jumps over the lazy dog.", "What is the weather?",
           "def add(x, y):", "I am fine", "Paris"]


def run(engine: Engine, requests: list[tuple[str, list[int], object]]) -> dict[str, tuple[list[int], str]]:
    """Tokens and finish reason of each request, all submitted at once and stepped until idle."""
    return {rid: (new_tokens(v), v[-1].finish_reason) for rid, v in drive(engine, requests).items()}


def test_batched_greedy_equals_single(model, tok):
    engine = Engine(model, tok)
    requests = []
    for i, prompt in enumerate(PROMPTS):
        cfg = request_settings(model, tok, max_new_tokens=10 + i, block_size=[4, 8][i % 2])
        requests.append((f"r{i}", tok.encode(prompt), cfg))
    single = {}
    for request in requests:
        single.update(run(engine, [request]))
    batched = run(engine, requests)
    assert batched == single
    assert all(len(tokens) > 0 for tokens, _ in single.values())


def test_matches_model_generate(model, tok):
    """The engine decodes exactly as the model package's `generate` (same settings)."""
    cfg = request_settings(model, tok, max_new_tokens=12, block_size=4)
    ids = tok.encode(PROMPTS[1])
    tokens, _ = run(Engine(model, tok), [("a", ids, cfg)])["a"]
    reference = model.generate(torch.tensor([ids]), max_new_tokens=12, block_size=4,
                               eos_token_id=list(cfg.eos_token_id),
                               think_start_token_id=cfg.think_start_token_id,
                               think_end_token_id=cfg.think_end_token_id)
    assert tokens == reference[0, len(ids):].tolist()

def test_stack_split_round_trip(model, tok):
    """Stacking per-request caches of different lengths and splitting them back is lossless."""
    caches = []
    for prompt in PROMPTS[:3]:
        cache = model.new_cache()
        model(torch.tensor([tok.encode(prompt)]), past_key_values=cache)
        caches.append(cache)
    batched = stack_caches(caches, model.new_cache())
    assert batched.cache.seq_length == max(c.seq_length for c in caches)
    back = split_cache(batched.cache, batched.pads, [model.new_cache() for _ in caches])
    for a, b in zip(caches, back):
        assert a.seq_length == b.seq_length
        for la, lb in zip(a.layers, b.layers):
            for name, t in la.tensors().items():
                assert torch.equal(t, lb.tensors()[name]), name


def test_queue_bound(model, tok):
    engine = Engine(model, tok, EngineConfig(SchedulerConfig(max_batch_size=1, max_queue=2)))
    cfg = request_settings(model, tok, max_new_tokens=4)
    for i in range(2):
        engine.submit(EngineRequest(f"q{i}", [5, 6], cfg), lambda out: None)
    with pytest.raises(QueueFullError):
        engine.submit(EngineRequest("q2", [5, 6], cfg), lambda out: None)


def test_batch_size_bound_and_abort(model, tok):
    engine = Engine(model, tok, EngineConfig(SchedulerConfig(max_batch_size=2)))
    cfg = request_settings(model, tok, max_new_tokens=64, block_size=4)
    outs = {f"r{i}": [] for i in range(3)}
    for rid, sink in outs.items():
        engine.submit(EngineRequest(rid, tok.encode("hello"), cfg), sink.append)
    with torch.inference_mode():
        engine.step()
        assert engine.scheduler.num_running == 2 and engine.scheduler.num_waiting == 1
        victim = engine.scheduler.running[0]
        assert victim.cache is not None
        engine.abort(victim.request_id)
        engine.step()  # the aborted row leaves before the forward; the waiting one joins
    assert victim not in engine.scheduler.running and victim.cache is None
    assert outs[victim.request_id][-1].finish_reason == "abort"
    assert engine.scheduler.num_running == 2 and engine.scheduler.num_waiting == 0
    assert {s.phase for s in engine.scheduler.running} <= {Phase.DENOISE, Phase.COMMIT}


def test_sampling_is_seeded_per_request(model, tok):
    engine = Engine(model, tok)
    cfg = request_settings(model, tok, max_new_tokens=8, block_size=4, temperature=1.0)
    ids = tok.encode(PROMPTS[0])

    def sample(seed, others=0):
        reqs = [("s", ids, cfg)] + [(f"o{i}", tok.encode(PROMPTS[i + 1]), cfg) for i in range(others)]
        outs = {rid: [] for rid, _, _ in reqs}
        for rid, p, c in reqs:
            engine.submit(EngineRequest(rid, p, c, seed=seed), outs[rid].append)
        with torch.inference_mode():
            while engine.scheduler.num_running or engine.scheduler.num_waiting:
                engine.step()
        return [t for o in outs["s"] for t in o.new_token_ids]

    assert sample(7) == sample(7, others=2)


def test_failing_row_does_not_fail_its_batch(tok):
    """A forward that raises for one row is retried row by row: only that request fails."""
    from serve_fixtures import ScriptedModel, scripted_answer

    model = ScriptedModel(tok, scripted_answer)
    engine = Engine(model, tok)
    cfg = request_settings(model, tok, max_new_tokens=40, block_size=8)
    out = run(engine, [("bad", tok.encode("EXPLODE"), cfg), ("good", tok.encode("2+2?"), cfg)])
    assert out["bad"] == ([], "error")
    tokens, reason = out["good"]
    assert reason == "stop"
    assert tok.decode(tokens) == "<think>\nLet me think.\n</think>\n\nThe answer is 4.<|im_end|>"
    assert engine.scheduler.num_running == 0


def test_chunked_prefill_matches_whole_prompt(model, tok):
    """Long prompts fed in pieces of 4 (alone and batched with short ones) decode as when the
    prompt is prefilled in one forward."""
    requests = []
    for i, prompt in enumerate(PROMPTS):
        cfg = request_settings(model, tok, max_new_tokens=8, block_size=[4, 8][i % 2])
        requests.append((f"r{i}", tok.encode(prompt), cfg))
    whole = run(Engine(model, tok), requests)
    chunked = Engine(model, tok, EngineConfig(SchedulerConfig(prefill_chunk=4)))
    assert run(chunked, requests) == whole
    assert chunked.metrics.value("clover_prompt_tokens_total") == sum(len(ids) for _, ids, _ in requests)
    assert max(len(ids) for _, ids, _ in requests) > 8  # some prompts really took several pieces
