"""Self-speculative decoding (SPEC §7, C6): greedy output equals greedy AR for every block size,
an oracle drafter emits B tokens per verify and an adversarial one 1, GDN states after a rollback
equal a fresh prefill (fp32, atol 1e-5: a causal pass over a draft and a prefill run the delta
rule over different spans), and sampling keeps the AR distribution (chi-square, p < 1e-3 fails).
"""

import pytest
import torch

from clover.model.cache import GatedDeltaNetLayerCache
from clover.model.generation_autoregressive import draft_block, rollback, self_speculative_steps, verify_block
from clover.model.generation_batch import BlockEvent, RunLog, start_batch
from clover.model.generation_config import resolve_config
from decoding_helpers import CONTROLS_OFF, CONTROLS_ON, EOS, left_pad, peaked_model, prompt

MASK = 127


@pytest.fixture(scope="module")
def model():
    return peaked_model(seed=1, head_scale=8.0)


@pytest.mark.parametrize("block_size", [4, 8, 16, 32])
def test_c6_greedy_self_spec_equals_greedy_ar(model, block_size):
    ids, mask = left_pad([prompt(9, seed=2), prompt(5, seed=3)])
    settings = dict(max_new_tokens=40, do_sample=False, block_size=block_size, eos_token_id=[EOS], **CONTROLS_ON)
    ar = model.generate(ids, mask, mode="ar", **settings)
    spec = model.generate(ids, mask, mode="self_spec", **settings)
    assert torch.equal(spec, ar)


def test_c6_with_more_draft_passes(model):
    ids = torch.tensor([prompt(7, seed=4)])
    settings = dict(max_new_tokens=30, do_sample=False, block_size=8, **CONTROLS_OFF)
    ar = model.generate(ids, mode="ar", **settings)
    assert torch.equal(model.generate(ids, mode="self_spec", draft_steps=3, **settings), ar)


def run_with_drafter(model, ids, block_size, drafter_of):
    cfg = resolve_config(None, model.config, dict(max_new_tokens=24, do_sample=False, block_size=block_size,
                                                 mode="self_spec", **CONTROLS_OFF))
    events = list(self_speculative_steps(model, ids, torch.ones_like(ids), cfg, [], drafter=drafter_of(cfg)))
    return [len(e.token_ids) for e in events if isinstance(e, BlockEvent)], events[-1].output.sequences


@pytest.mark.parametrize("block_size", [4, 8])
def test_oracle_drafter_emits_a_block_per_verify_and_adversarial_one(model, block_size):
    ids = torch.tensor([prompt(6, seed=5)])
    truth = model.generate(ids, mode="ar", max_new_tokens=24 + block_size, do_sample=False, **CONTROLS_OFF)[0]
    width = ids.shape[1]

    def oracle(cfg):
        def drafter(logits, block):
            offset = drafter.emitted
            drafter.emitted += block.shape[1]
            return truth[width + offset:width + offset + block.shape[1]][None].clone()
        drafter.emitted = 0
        return drafter


    sizes, seq = run_with_drafter(model, ids, block_size, oracle)
    assert sizes == [block_size] * (24 // block_size)
    assert torch.equal(seq[0], truth[:width + 24])
    sizes, seq = run_with_drafter(model, ids, block_size, lambda cfg: adversarial(model, truth, width))
    assert sizes == [1] * 24
    assert torch.equal(seq[0], truth[:width + 24])


def adversarial(model, truth, width):
    """Drafts that always differ from the AR continuation at the first guessed position."""
    state = {"n": 0}

    def drafter(logits, block):
        n = state["n"]
        wrong = block.clone()
        wrong[0, 1:] = 8 + (truth[width + n + 1] - 7) % 100  # != truth[n + 1], never the mask
        state["n"] += 1
        return wrong
    return drafter


def gdn_states(cache):
    return [(layer.conv_state, layer.recurrent_state) for layer in cache.layers
            if isinstance(layer, GatedDeltaNetLayerCache)]


@torch.no_grad()
def test_gdn_state_after_rollback_equals_a_fresh_prefill(model):
    ids = torch.tensor([prompt(10, seed=6)])
    cfg = resolve_config(None, model.config, dict(max_new_tokens=32, do_sample=False, block_size=8,
                                                 mode="self_spec", **CONTROLS_OFF))
    log = RunLog(1, 32, 0, ids.device)
    batch = start_batch(model, ids, torch.ones_like(ids), cfg)
    model(ids, attention_mask=torch.ones_like(ids), past_key_values=batch.cache)
    batch.attention_mask = torch.ones_like(ids)
    first = torch.tensor([[9]])
    draft = draft_block(model, batch, first[:, :0], first, 0, cfg, [], log, None)
    draft[0, 3:] = 8  # force a rejection after at most two accepted tokens
    snapshot = batch.cache.snapshot()
    result = verify_block(model, batch, draft, 0, cfg, [], log)
    assert result.accepted < 7
    pending = rollback(batch, snapshot, result, 8)
    model(pending, attention_mask=torch.ones(1, ids.shape[1] + pending.shape[1], dtype=torch.long),
          past_key_values=batch.cache)
    fresh = model.new_cache()
    text = torch.cat((ids, result.emitted), dim=1)
    model(text, past_key_values=fresh)
    assert batch.cache.get_seq_length() == fresh.get_seq_length() == text.shape[1]
    for (conv, state), (conv_ref, state_ref) in zip(gdn_states(batch.cache), gdn_states(fresh)):
        torch.testing.assert_close(conv, conv_ref, rtol=0, atol=1e-5)
        torch.testing.assert_close(state, state_ref, rtol=0, atol=1e-5)


@torch.no_grad()
def test_sampling_keeps_the_ar_distribution(model):
    """Two sampled tokens (top-k 3: nine outcomes), 400 rows, against the exact AR pair probabilities."""
    ids = torch.tensor([prompt(5, seed=7)])
    settings = dict(do_sample=True, temperature=1.0, top_k=3, **CONTROLS_OFF)

    def top3(logits):
        logits = logits.clone()
        logits[MASK] = float("-inf")
        values, tokens = logits.topk(3)
        return tokens.tolist(), values.softmax(-1).tolist()

    exact = {}
    first, p_first = top3(model(ids).logits[0, -1])
    for t1, p1 in zip(first, p_first):
        second, p_second = top3(model(torch.cat((ids, torch.tensor([[t1]])), 1)).logits[0, -1])
        for t2, p2 in zip(second, p_second):
            exact[(t1, t2)] = p1 * p2
    rows = 400
    out = model.generate(ids.repeat(rows, 1), mode="self_spec", block_size=4, max_new_tokens=2, seed=11,
                         **settings)
    pairs = [tuple(r) for r in out[:, -2:].tolist()]
    assert set(pairs) <= set(exact)
    chi2 = sum((pairs.count(k) - rows * p) ** 2 / (rows * p) for k, p in exact.items())
    assert chi2 < 26.1, chi2  # chi-square, 8 degrees of freedom, p = 0.001
