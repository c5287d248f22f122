"""Prefix caching (output with a hit token-identical to without, LRU under the byte budget,
/metrics counters) and the step token budget (a long prompt does not block a short request)."""

import pytest
import torch

from clover.serving.engine import Engine, EngineConfig
from clover.serving.scheduler import EngineRequest, SchedulerConfig

from serve_fixtures import drive, new_tokens, request_settings

pytestmark = pytest.mark.usefixtures("one_thread")

SYSTEM = "You are a careful assistant. Answer in one short sentence, and never guess. " * 2


def run(engine, requests):
    """Tokens of each (id, prompt ids) request at 8 new tokens in blocks of 4, stepped until idle."""
    settings = request_settings(engine.model, engine.tokenizer, max_new_tokens=8, block_size=4)
    return {rid: new_tokens(v) for rid, v in drive(engine, [(rid, ids, settings) for rid, ids in requests]).items()}


def engine(model, tok, mb: float, chunk: int = 8, step_tokens: int = 2048):
    scheduler = SchedulerConfig(prefill_chunk=chunk, max_step_tokens=step_tokens, attention_tokens=None)
    return Engine(model, tok, EngineConfig(scheduler, prefix_cache_mb=mb))


def test_a_prefix_hit_gives_the_same_tokens(model, tok):
    first, second = tok.encode(SYSTEM + "What is 2+2?"), tok.encode(SYSTEM + "Name a colour.")
    cold = run(engine(model, tok, 0), [("b", second)])["b"]
    warm_engine = engine(model, tok, 64)
    run(warm_engine, [("a", first)])
    assert warm_engine.metrics.value("clover_prefix_cache_hit_tokens_total") == 0
    assert run(warm_engine, [("b", second)])["b"] == cold
    shared = next(i for i, (x, y) in enumerate(zip(first, second)) if x != y)
    hit = warm_engine.metrics.value("clover_prefix_cache_hit_tokens_total")
    assert hit == shared // 8 * 8 > 0  # whole pages of the shared prefix
    assert warm_engine.metrics.value("clover_prefix_cache_miss_tokens_total") == len(first) + len(second) - hit
    assert "clover_prefix_cache_hit_tokens_total" in warm_engine.metrics.render()[0].decode()


@torch.no_grad()
def test_lru_eviction_keeps_the_budget(model, tok):
    """Three pages stored under a budget of two: the least recently used one goes, and a chain
    missing a page stops hitting there."""
    from clover.serving.cache import PrefixCache

    prompt = tok.encode(SYSTEM)[:25]
    cache, pages = model.new_cache(), PrefixCache(2 ** 30, 8)
    for end in (8, 16, 24):
        model(torch.tensor([prompt[end - 8:end]]), past_key_values=cache)
        pages.store(prompt, end, cache)
    assert pages.lookup(prompt).length == 24
    entry = next(iter(pages.entries.values())).nbytes
    pages = PrefixCache(2 * entry, 8)
    cache = model.new_cache()
    for end in (8, 16, 24):
        model(torch.tensor([prompt[end - 8:end]]), past_key_values=cache)
        pages.store(prompt, end, cache)
    assert pages.nbytes <= 2 * entry and len(pages.entries) == 2
    assert pages.lookup(prompt).length == 0  # page 1 was evicted first


def test_step_budget_lets_a_short_request_finish_during_a_long_prefill(model, tok):
    long_prompt, short_prompt = tok.encode(SYSTEM * 3), tok.encode("Hi")
    eng = engine(model, tok, 0, chunk=8, step_tokens=8)
    cfg = request_settings(model, tok, max_new_tokens=4, block_size=4)
    done_at, steps = {}, [0]

    def sink(output):
        if output.finished:
            done_at[output.request_id] = steps[0]
    eng.submit(EngineRequest("long", long_prompt, cfg), sink)
    eng.submit(EngineRequest("short", short_prompt, cfg), sink)
    with torch.inference_mode():
        while eng.scheduler.num_running or eng.scheduler.num_waiting:
            before = eng.metrics.value("clover_prompt_tokens_total")
            eng.step()
            assert eng.metrics.value("clover_prompt_tokens_total") - before <= 8  # the step budget
            steps[0] += 1
    assert done_at["short"] < len(long_prompt) // 16  # finished before half the long prompt was fed
    assert done_at["short"] < done_at["long"]
    assert eng.metrics.value("clover_prompt_tokens_total") == len(long_prompt) + len(short_prompt)


def test_attention_budget_cost_and_the_most_tokens_it_affords():
    """A prompt token at position c costs 1 + c / A; `affordable_tokens` is the largest piece whose
    cost fits, so pieces shrink with depth; without A the budget counts tokens."""
    from clover.serving.scheduler import affordable_tokens, prompt_cost

    assert prompt_cost(0, 4, None) == 4.0 and prompt_cost(100, 4, 100) == 4 * (1 + 101.5 / 100)
    for start in (0, 100, 4096, 31_000):
        n = affordable_tokens(start, 2048, 2048)
        assert prompt_cost(start, n, 2048) <= 2048 < prompt_cost(start, n + 1, 2048)
    assert affordable_tokens(0, 2048, 2048) > 4 * affordable_tokens(16_384, 2048, 2048) > 0
    assert affordable_tokens(5000, 37, None) == 37 and affordable_tokens(5000, 0.5, 64) == 0


def test_attention_budget_cuts_deep_pieces_and_keeps_the_tokens(model, tok):
    """With the attention-aware budget a long prompt is fed in pieces that get shorter with depth (a
    step's prompt cost stays within the budget), and the output is the token budget's exactly."""
    from clover.serving.scheduler import prompt_cost

    ids = tok.encode(SYSTEM * 3 + "What is 2+2?")
    settings = request_settings(model, tok, max_new_tokens=8)
    outs = {}
    for a in (None, 32):
        eng = Engine(model, tok, EngineConfig(SchedulerConfig(prefill_chunk=64, max_step_tokens=48,
                                                              attention_tokens=a), prefix_cache_mb=0))
        pieces, got, fed = [], [], 0
        eng.submit(EngineRequest("r", ids, settings), got.append)
        with torch.inference_mode():
            while eng.scheduler.num_running or eng.scheduler.num_waiting:
                eng.step()
                seq = eng.scheduler.running[0] if eng.scheduler.running else None
                if seq is not None and seq.prefilled > fed:
                    pieces.append((fed, seq.prefilled - fed))
                    fed = seq.prefilled
        outs[a] = [t for o in got for t in o.new_token_ids]
        if a is not None:
            sizes = [n for _, n in pieces]
            assert len(ids) > 150 and len(sizes) > 4 and sizes[0] > max(sizes[len(sizes) // 2:])
            assert all(prompt_cost(p, n, a) <= 48 for p, n in pieces)
    assert outs[None] == outs[32]


def test_piece_time_over_the_share_is_owed_until_other_work_pays_it():
    from clover.serving.scheduler import spend_piece_time

    assert spend_piece_time(0.0, 3.0, 1.0, 0.5) == 2.0  # share 0.5: a piece may take what the rest took
    assert spend_piece_time(2.0, 0.0, 1.0, 0.5) == 1.0 and spend_piece_time(1.0, 0.0, 1.0, 0.5) == 0.0
    assert spend_piece_time(0.0, 0.5, 1.0, 0.5) == 0.0  # under the share: no credit is banked
    assert spend_piece_time(0.0, 3.0, 1.0, 0.75) == 0.0  # share 3/4: three times the rest
    assert spend_piece_time(5.0, 3.0, 0.0, 0.5) == 0.0  # nobody else ran: nothing owed
    assert spend_piece_time(5.0, 3.0, 1.0, None) == 0.0
    with pytest.raises(ValueError, match="prefill_share=1.5"):
        SchedulerConfig(prefill_share=1.5)


def test_prefill_share_spaces_a_long_prompts_pieces_and_keeps_the_tokens(model, tok):
    """With the step times fixed (a piece forward 3, the rest 1) and share 0.5, the long prompt's
    pieces run in at most one step in three while the short request decodes, and every request's
    tokens are those without the share."""
    long_prompt, short_prompt = tok.encode(SYSTEM * 3), tok.encode("Hi")
    cfg = request_settings(model, tok, max_new_tokens=16, block_size=4)
    outs = {}
    for share in (None, 0.5):
        eng = Engine(model, tok, EngineConfig(SchedulerConfig(prefill_chunk=8, max_step_tokens=8, attention_tokens=None,
                                                              prefill_share=share), prefix_cache_mb=0))
        account = eng.scheduler.account
        eng.scheduler.account = lambda piece, other: account(3.0 * (piece > 0), 1.0 * (other > 0))  # noqa: B023
        got = {"long": [], "short": []}
        for rid, ids in (("long", long_prompt), ("short", short_prompt)):
            eng.submit(EngineRequest(rid, ids, cfg), got[rid].append)
        pieces_while_decoding = []
        with torch.inference_mode():
            while eng.scheduler.num_running or eng.scheduler.num_waiting:
                running = {s.request_id: s for s in eng.scheduler.running}
                decoding = "short" in running and not running["short"].in_prompt
                fed = running["long"].prefilled if "long" in running else None
                eng.step()
                if decoding and fed is not None and running["long"].in_prompt:
                    pieces_while_decoding.append(running["long"].prefilled > fed)
        outs[share] = {rid: [t for o in v for t in o.new_token_ids] for rid, v in got.items()}
        if share is None:
            assert all(pieces_while_decoding)
        else:
            assert len(pieces_while_decoding) >= 6 and any(pieces_while_decoding)
            assert all(sum(pieces_while_decoding[i:i + 3]) <= 1 for i in range(len(pieces_while_decoding) - 2))
    assert outs[None] == outs[0.5] and all(outs[None].values())


def test_a_piece_is_cut_to_the_other_rows_step_time_from_the_measured_rate():
    """The rate comes from the last step's pieces (prompt cost per second); a piece is cut to what
    that rate affords in the other rows' last step time, never under MIN_TIMED_PIECE tokens."""
    from types import SimpleNamespace

    from clover.serving.scheduler import MIN_TIMED_PIECE, Scheduler

    sched = Scheduler(SchedulerConfig(attention_tokens=None))
    start = SimpleNamespace(prefilled=0)
    assert sched._timed_piece(start, 512) == 512  # nothing measured yet
    sched._piece_cost = 2000.0
    sched.account(2.0, 0.5)  # 2,000 prompt tokens in 2 s beside 0.5 s of decoding rows
    assert sched._timed_piece(start, 512) == 500 and sched._timed_piece(start, 300) == 300
    sched._piece_cost = 0.0
    sched.account(0.0, 0.01)  # a fast decoding step: the cut would be 10 tokens
    assert sched._timed_piece(start, 512) == MIN_TIMED_PIECE
