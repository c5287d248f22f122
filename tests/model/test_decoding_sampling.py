"""Sampling: reproducible with a seed; filtering never changes confidence (so top_k=1 = greedy)."""

import torch

from decoding_helpers import CONTROLS_ON, EOS, one_thread, peaked_model, prompt  # noqa: F401

SETTINGS = dict(CONTROLS_ON, max_new_tokens=20, eos_token_id=[EOS], block_size=8, threshold=0.7)


def test_same_seed_same_output():
    model = peaked_model(head_scale=3.0)
    ids = torch.tensor([prompt(6, seed=1)] * 2)
    a = model.generate(ids, do_sample=True, seed=11, top_p=0.95, **SETTINGS)
    b = model.generate(ids, do_sample=True, seed=11, top_p=0.95, **SETTINGS)
    g = torch.Generator().manual_seed(11)
    c = model.generate(ids, do_sample=True, generator=g, top_p=0.95, **SETTINGS)
    d = model.generate(ids, do_sample=True, seed=12, top_p=0.95, **SETTINGS)
    assert torch.equal(a, b) and torch.equal(a, c)
    assert not torch.equal(a, d)


def test_top_k_one_sampling_equals_greedy():
    """Confidence ignores temperature / top-k / top-p: with top_k=1 the sampled token is the argmax,
    so the whole run, fills included, must equal greedy decoding."""
    model = peaked_model(head_scale=3.0)
    ids = torch.tensor([prompt(6, seed=2)])
    greedy = model.generate(ids, return_dict_in_generate=True, **SETTINGS)
    sampled = model.generate(ids, do_sample=True, top_k=1, temperature=0.3, top_p=0.5, seed=0,
                             return_dict_in_generate=True, **SETTINGS)
    assert torch.equal(greedy.sequences, sampled.sequences)
    assert greedy.rows[0].steps_per_block == sampled.rows[0].steps_per_block


def test_ar_sampling_is_reproducible():
    model = peaked_model(head_scale=3.0)
    ids = torch.tensor([prompt(5, seed=3)])
    a = model.generate(ids, mode="ar", do_sample=True, seed=5, **SETTINGS)
    b = model.generate(ids, mode="ar", do_sample=True, seed=5, **SETTINGS)
    assert torch.equal(a, b)
