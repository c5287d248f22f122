"""C1: causal mode reproduces transformers' `Qwen3_5MoeForCausalLM` on the same weights (fp32, 1e-4),
including a cached decode.

The weights have std 0.1: at 0.2 the random tiny model is chaotic enough that transformers' own fp32
chunked delta rule drifts 1.5e-4 from an fp64 run (ours: 2e-5), which would test their rounding."""

import torch
from transformers import DynamicCache, Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

from tiny import TINY, tiny_model


def reference_model(model):
    config = Qwen3_5MoeTextConfig(**{k: v for k, v in TINY.items() if k != "mask_token_id"},
                                  rope_parameters=dict(model.config.rope_parameters))
    reference = Qwen3_5MoeForCausalLM(config).eval()
    missing, unexpected = reference.load_state_dict(model.state_dict(), strict=False)
    assert not missing
    assert all(k.endswith(("conv_right_weight", "logit_scale", "history_bias", "history_c")) for k in unexpected)
    return reference


def test_c1_causal_logits_and_decode_match_transformers():
    model = tiny_model(scale=0.1)
    reference = reference_model(model)
    ids = torch.randint(0, 127, (2, 70), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference(ids).logits, rtol=0, atol=1e-4)
        cache, ref_cache = model.new_cache(), DynamicCache(config=reference.config)
        model(ids[:, :-1], past_key_values=cache)
        reference(ids[:, :-1], past_key_values=ref_cache, use_cache=True)
        ours = model(ids[:, -1:], past_key_values=cache).logits
        theirs = reference(ids[:, -1:], past_key_values=ref_cache, use_cache=True).logits
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-4)
