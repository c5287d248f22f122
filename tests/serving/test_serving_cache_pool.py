"""The engine's cache pool against its plain twin (per-request growing caches stacked into one batch
every step and split back): the same tokens (greedy, fp32) with mixed prompt lengths, prompt
pieces, prefix hits, and requests joining and leaving mid-run; slots reused after a request; a
request too long for a slot refused by name while the others go on."""

import pytest

from clover.serving.engine import Engine, EngineConfig
from clover.serving.scheduler import SchedulerConfig

from serve_fixtures import drive, new_tokens, request_settings

pytestmark = pytest.mark.usefixtures("one_thread")

SYSTEM = "You are a careful assistant. Answer in one short sentence. "
PROMPTS = ["hello world", SYSTEM + "The quick brown fox jumps over the lazy dog.", "What is the weather?",
           SYSTEM + "def add(x, y):", "I am fine", SYSTEM * 2 + "Paris", "Let me think", "x"]


def run_schedule(engine: Engine, schedule: list[tuple[int, str, list[int], object]]) -> dict:
    """Submit each (step, id, prompt ids, settings) before that engine step; step until idle.
    Returns id -> (tokens, finish reason, error)."""
    outs = drive(engine, [(rid, ids, settings) for _, rid, ids, settings in schedule],
                 at_step={rid: at for at, rid, _, _ in schedule})
    return {rid: (new_tokens(v), v[-1].finish_reason, v[-1].error) for rid, v in outs.items()}


def engine(model, tok, pool: bool, **settings) -> Engine:
    scheduler = SchedulerConfig(prefill_chunk=8, max_step_tokens=16, attention_tokens=None,
                                max_batch_size=settings.pop("batch", 32))
    return Engine(model, tok, EngineConfig(scheduler, cache_pool=pool, **settings))


def test_pool_gives_the_stacked_twins_tokens(model, tok):
    schedule = [(at, f"r{i}", tok.encode(p),
                 request_settings(model, tok, max_new_tokens=4 + 3 * i, block_size=[4, 8][i % 2]))
                for i, (at, p) in enumerate(zip([0, 0, 1, 2, 4, 7, 9, 12], PROMPTS))]
    eng = engine(model, tok, True)
    pooled = run_schedule(eng, schedule)
    assert pooled == run_schedule(engine(model, tok, False), schedule)
    assert eng.metrics.value("clover_prefix_cache_hit_tokens_total") > 0  # later SYSTEM prompts start from cached pages
    assert all(reason in ("stop", "length") and tokens for tokens, reason, _ in pooled.values())
    alone = {}
    for request in schedule[1::3]:  # batch independence: the same tokens with nobody beside it
        alone.update(run_schedule(engine(model, tok, True), [request]))
    assert alone == {rid: pooled[rid] for rid in alone}


def test_slots_are_reused(model, tok):
    eng = engine(model, tok, True, batch=2)
    settings = request_settings(model, tok, max_new_tokens=8, block_size=4)
    run_schedule(eng, [(0, "a", tok.encode(PROMPTS[0]), settings), (0, "b", tok.encode(PROMPTS[2]), settings)])
    slots = list(eng.pool.free)
    buffers = [layer.key_buffer.data_ptr() for c in slots for layer in c.layers if hasattr(layer, "key_buffer")]
    assert len(slots) == 2 and eng.pool.taken == 0
    run_schedule(eng, [(i, f"c{i}", tok.encode(p), settings)  # 4 requests, 2 slots
                       for i, p in enumerate(PROMPTS[4:8])])
    assert eng.pool.taken == 0 and sorted(map(id, eng.pool.free)) == sorted(map(id, slots))
    assert [layer.key_buffer.data_ptr() for c in slots for layer in c.layers if hasattr(layer, "key_buffer")] == buffers


def test_a_request_beyond_the_slot_capacity_fails_alone(model, tok):
    eng = engine(model, tok, True, slot_tokens=64)
    short = request_settings(model, tok, max_new_tokens=8, block_size=4)
    long_ids = tok.encode(SYSTEM * 3)
    schedule = [(0, "long", long_ids, request_settings(model, tok, max_new_tokens=16, block_size=4)),
                (0, "short", tok.encode(PROMPTS[0]), short)]
    out = run_schedule(eng, schedule)
    tokens, reason, error = out["long"]
    assert reason == "error" and not tokens
    need = len(long_ids) + 16 + 2 * 4
    assert f"needs {need} cache positions" in error and "slot's 64" in error
    assert out["short"] == run_schedule(engine(model, tok, True), [schedule[1]])["short"]
    again = run_schedule(eng, [(0, "next", tok.encode(PROMPTS[2]), short)])["next"]
    assert again[1] in ("stop", "length") and again[0]


def test_the_server_refuses_a_request_beyond_a_slot_with_400(tok):
    import openai

    from clover.serving import Runtime, ServerConfig, create_app
    from serve_fixtures import ScriptedModel, ServerThread, scripted_answer, wait_ready

    model = ScriptedModel(tok, scripted_answer)
    config = EngineConfig(num_threads=1, slot_tokens=160)
    srv = ServerThread(create_app(ServerConfig(), lambda m: Runtime.from_objects(model, tok, config, m))).start()
    try:
        client = openai.OpenAI(api_key="none", base_url=srv.base_url + "/v1", max_retries=0, timeout=60)
        wait_ready(client)
        with pytest.raises(openai.BadRequestError, match="more than a cache slot's 160"):
            client.chat.completions.create(model="clover", messages=[{"role": "user", "content": SYSTEM * 4}],
                                           max_tokens=8)
        ok = client.chat.completions.create(model="clover", messages=[{"role": "user", "content": "Hi"}],
                                            max_tokens=8, extra_body={"enable_thinking": False})
        assert ok.choices[0].message.content
    finally:
        srv.stop()


def test_slot_size_is_at_most_a_quarter_over_the_need():
    from clover.serving.cache import slot_size

    sizes = {slot_size(n) for n in range(1, 70_000)}
    assert all(slot_size(n) >= n and slot_size(n) <= 1.25 * n for n in range(1, 70_000))
    assert {s for s in sizes if 16_384 < s <= 32_768} == {20_480, 24_576, 28_672, 32_768}  # four per octave
    assert slot_size(16_904) == 20_480  # a 16K prompt with 512 new tokens: 1.21x, not 32,768 (1.94x)
