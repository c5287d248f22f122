"""The server's per-request `mode` (block_diffusion, ar, self_spec; SPEC §7): the engine's AR equals
`model.generate(mode="ar")`, self_spec equals AR token for token (C6) with requests of all modes
in one engine (cache pool and its plain twin, prompt pieces, prefix hits across modes), oracle and
adversarial drafters exercise the kept and the rolled-back verify; over HTTP the same holds for
concurrent mixed requests, streaming, stop strings, max_tokens and logprobs, and a bad mode or an
unsupported combination is a 400 that names it while the server goes on serving."""

import threading

import openai
import pytest

from clover.serving.engine import Engine, EngineConfig
from clover.serving.scheduler import SchedulerConfig

from serve_fixtures import drive, generate_like, new_tokens, request_settings

pytestmark = pytest.mark.usefixtures("one_thread")

SYSTEM = "You are a careful assistant. Answer in one short sentence. "
PROMPTS = ["hello world", SYSTEM + "The quick brown fox jumps over the lazy dog.", "What is the weather?",
           SYSTEM + "def add(x, y):"]
MODES = ("block_diffusion", "ar", "self_spec")


def outcomes(engine: Engine, requests: list[tuple[str, list[int], object]]) -> dict:
    """Submit all, step until idle; id -> (tokens, finish reason, forwards of the request)."""
    return {rid: (new_tokens(v), v[-1].finish_reason, v[-1].num_forwards) for rid, v in drive(engine, requests).items()}


def small_engine(model, tok, pool: bool = True, cls=Engine, prefix_mb: float = 64.0) -> Engine:
    scheduler = SchedulerConfig(prefill_chunk=8, max_step_tokens=16, attention_tokens=None)  # token budget
    return cls(model, tok, EngineConfig(scheduler, cache_pool=pool, prefix_cache_mb=prefix_mb))


def reference_ar(model, tok, ids: list[int], max_new_tokens: int) -> list[int]:
    return generate_like(model, ids, request_settings(model, tok, max_new_tokens=max_new_tokens, mode="ar"))


@pytest.mark.parametrize("pool", [True, False])
def test_mixed_modes_in_one_engine(model, tok, pool):
    """All modes decode side by side: AR equals model.generate(mode="ar"), self_spec equals AR for
    block sizes 2 to 8, block diffusion equals itself decoded alone."""
    requests = []
    for i, prompt in enumerate(PROMPTS):
        ids = tok.encode(prompt)
        for mode in MODES:
            settings = request_settings(model, tok, max_new_tokens=12 + i, block_size=[2, 4, 8, 4][i], mode=mode)
            requests.append((f"{mode}{i}", ids, settings))
    out = outcomes(small_engine(model, tok, pool), requests)
    for i, prompt in enumerate(PROMPTS):
        ids = tok.encode(prompt)
        assert out[f"ar{i}"][0] == reference_ar(model, tok, ids, 12 + i)
        assert out[f"self_spec{i}"][:2] == out[f"ar{i}"][:2]
        alone = outcomes(small_engine(model, tok, pool), [r for r in requests if r[0] == f"block_diffusion{i}"])
        assert out[f"block_diffusion{i}"][:2] == alone[f"block_diffusion{i}"][:2]


def test_prefix_cache_is_shared_across_modes(model, tok):
    """A prompt prefix stored by a block-diffusion request is hit by AR and self_spec requests, and
    their tokens are those of a cold engine."""
    first, second = tok.encode(SYSTEM + "What is 2+2?"), tok.encode(SYSTEM + "Name a colour.")
    warm = small_engine(model, tok)
    drive(warm, [("a", first, request_settings(model, tok, max_new_tokens=8, block_size=4))])
    for mode in ("ar", "self_spec"):
        settings = request_settings(model, tok, max_new_tokens=10, block_size=4, mode=mode)
        cold = outcomes(small_engine(model, tok, prefix_mb=0), [("b", second, settings)])["b"][:2]
        hits = warm.metrics.value("clover_prefix_cache_hit_tokens_total")
        assert outcomes(warm, [("b", second, settings)])["b"][:2] == cold
        assert warm.metrics.value("clover_prefix_cache_hit_tokens_total") - hits >= 8


class ScriptedDrafts(Engine):
    """Drafts from the known AR answer of each prompt: `oracle` (right) or adversarial (wrong at
    every position), as `self_speculative_steps(drafter=...)` does in the model package."""

    answers: dict[tuple, list[int]] = {}
    oracle = True

    def _draft(self, seq, logits):
        answer, n = self.answers[tuple(seq.request.prompt_ids)], len(seq.generated)
        draft = seq.block.clone()
        for j in range(1, seq.block_size):
            right = answer[n + j] if n + j < len(answer) else 0
            draft[j] = right if self.oracle else (right + 1) % (self.mask_token_id or 1)
        return draft


@pytest.mark.parametrize("oracle", [True, False])
def test_oracle_and_adversarial_drafts(model, tok, oracle):
    """An oracle draft keeps whole verifies (B tokens per DRAFT+VERIFY, the cache written by the
    verify kept), an adversarial one keeps none (1 token per verify, every verify rolled back);
    both give AR's tokens, next to AR and block-diffusion requests in the same steps."""
    block, budget = 4, 16
    ids = [tok.encode(p) for p in PROMPTS]
    answers = {tuple(i): reference_ar(model, tok, i, budget) for i in ids}
    engine_cls = type("Drafts", (ScriptedDrafts,), {"answers": answers, "oracle": oracle})
    requests = [(f"s{k}", i, request_settings(model, tok, max_new_tokens=budget, block_size=block, mode="self_spec"))
                for k, i in enumerate(ids)]
    requests += [("ar", ids[1], request_settings(model, tok, max_new_tokens=budget, mode="ar")),
                 ("bd", ids[2], request_settings(model, tok, max_new_tokens=budget, block_size=block))]
    for pool in (True, False):
        out = outcomes(small_engine(model, tok, pool, cls=engine_cls), requests)
        for k, i in enumerate(ids):
            tokens, _, forwards = out[f"s{k}"]
            assert tokens == answers[tuple(i)]
            prefill = -(-len(i) // 8)  # prompt pieces of 8 (the last one gives the first token)
            verifies = (forwards - prefill) // 2
            if oracle:
                assert verifies <= -(-len(tokens) // block)
            else:
                assert verifies >= len(tokens) - 1
        assert out["ar"][0] == answers[tuple(ids[1])]


# -- over HTTP -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(model, tok):
    from clover.serving import ServerConfig
    from serve_fixtures import serve_model

    srv = serve_model(model, tok, ServerConfig())
    yield srv
    srv.stop()


def complete(srv, prompt, mode=None, **kw):
    extra = {"block_size": 4, **({"mode": mode} if mode else {})}
    return srv.client.completions.create(model="clover", prompt=prompt, temperature=0, extra_body=extra, **kw)


def test_http_ar_equals_generate_and_self_spec_equals_ar(server, model, tok):
    ids = tok.encode(PROMPTS[1])
    ar = complete(server, ids, "ar", max_tokens=14)
    reference = reference_ar(model, tok, ids, 14)
    assert ar.usage.completion_tokens == len(reference)
    eos = request_settings(model, tok).eos_token_id
    assert ar.choices[0].text == tok.decode([t for t in reference if t not in eos])
    spec = complete(server, ids, "self_spec", max_tokens=14)
    assert spec.choices[0].text == ar.choices[0].text
    assert spec.choices[0].finish_reason == ar.choices[0].finish_reason


def test_http_concurrent_mixed_modes(server):
    """Several concurrent requests of every mode (some streamed) in one server: each text equals the
    same request sent alone; self_spec equals AR."""
    alone = {(p, m): complete(server, p, m, max_tokens=12).choices[0].text for p in PROMPTS for m in MODES}
    got, errors = {}, []

    def send(p, m, stream):
        try:
            if stream:
                chunks = complete(server, p, m, max_tokens=12, stream=True)
                got[(p, m, stream)] = "".join(c.choices[0].text for c in chunks if c.choices)
            else:
                got[(p, m, stream)] = complete(server, p, m, max_tokens=12).choices[0].text
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=send, args=(p, m, s)) for p in PROMPTS for m in MODES for s in (False, True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    for (p, m, _), text in got.items():
        assert text == alone[(p, m)], (p, m)
    for p in PROMPTS:
        assert alone[(p, "self_spec")] == alone[(p, "ar")]
    assert len(got) == len(threads)


def test_http_stop_max_tokens_and_logprobs_in_causal_modes(server):
    """max_tokens bounds AR and self_spec exactly; a stop string cuts both at the same place; a
    self_spec token's logprob is the AR one (the verify chooses from the AR distribution)."""
    prompt = PROMPTS[0]
    for max_tokens in (1, 5):
        texts = {m: complete(server, prompt, m, max_tokens=max_tokens, logprobs=2) for m in ("ar", "self_spec")}
        for r in texts.values():
            assert r.usage.completion_tokens <= max_tokens
            assert len(r.choices[0].logprobs.token_logprobs) == r.usage.completion_tokens
        ar, spec = texts["ar"].choices[0], texts["self_spec"].choices[0]
        assert spec.text == ar.text and spec.logprobs.tokens == ar.logprobs.tokens
        assert spec.logprobs.token_logprobs == pytest.approx(ar.logprobs.token_logprobs, abs=1e-4)
    full = complete(server, prompt, "ar", max_tokens=12).choices[0].text
    stop = full[len(full) // 2:len(full) // 2 + 2]
    cut = {m: complete(server, prompt, m, max_tokens=12, stop=[stop]).choices[0] for m in ("ar", "self_spec")}
    assert cut["ar"].text == cut["self_spec"].text == full[:full.index(stop)]
    assert cut["ar"].finish_reason == cut["self_spec"].finish_reason == "stop"


def test_http_bad_mode_and_unsupported_combination_are_400(server):
    with pytest.raises(openai.BadRequestError) as bad:
        complete(server, "hi", "speculative", max_tokens=4)
    message = bad.value.body["message"]
    assert "'speculative'" in message and all(m in message for m in MODES)
    assert bad.value.body["param"] == "mode"
    with pytest.raises(openai.BadRequestError) as chat_bad:
        server.client.chat.completions.create(model="clover", messages=[{"role": "user", "content": "hi"}],
                                              max_tokens=4, extra_body={"mode": "AR"})
    assert "'AR'" in chat_bad.value.body["message"]
    with pytest.raises(openai.BadRequestError, match="response_format .*mode='self_spec'"):
        server.client.chat.completions.create(
            model="clover", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
            response_format={"type": "json_object"}, extra_body={"mode": "self_spec", "enable_thinking": False})
    with pytest.raises(openai.BadRequestError, match="block_size=1 .*self_spec"):
        server.client.completions.create(model="clover", prompt="hi", max_tokens=4,
                                         extra_body={"mode": "self_spec", "block_size": 1})
    ok = server.client.chat.completions.create(model="clover", messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=4, extra_body={"mode": "self_spec"})
    assert ok.choices[0].finish_reason in ("stop", "length") and ok.usage.completion_tokens > 0


@pytest.mark.parametrize("name, bad, good", [("mode", "fast", "ar"), ("fallback", "left", "causal")])
def test_server_default_mode(model, tok, name, bad, good):
    """`Runtime.from_objects(mode=..., fallback=...)` (`clover serve --mode`, `--fallback`) set the
    decoding of requests naming none; an unknown value is refused."""
    from clover.serving import Runtime

    with pytest.raises(ValueError, match=f"{name}='{bad}' is invalid"):
        Runtime.from_objects(model, tok, EngineConfig(num_threads=1), **{name: bad})
    rt = Runtime.from_objects(model, tok, EngineConfig(num_threads=1), **{name: good})
    try:
        assert getattr(rt.defaults, name) == good
    finally:
        rt.shutdown()
