"""Tiny configs that make model tests run in seconds on a CPU (fp32). Import as `from tiny import ...`
(tests/conftest.py puts this folder on sys.path)."""

import torch

from clover.model import CloverMoeConfig, CloverMoeForCausalLM

TINY = dict(
    vocab_size=128, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4,
    linear_key_head_dim=8, linear_value_head_dim=8, num_experts=8, num_experts_per_tok=2,
    moe_intermediate_size=16, shared_expert_intermediate_size=16, mask_token_id=127,
    max_position_embeddings=4096,
)


def tiny_config(**overrides) -> CloverMoeConfig:
    return CloverMoeConfig(**{**TINY, **overrides})


def tiny_model(seed: int = 0, scale: float = 0.2, block_params: bool = True, **overrides):
    """A random fp32 model. `scale` sets the weight std; `block_params` randomises the block-mode
    parameters (right conv, softmax scalars) so block mode differs from the zero-initialised one."""
    torch.manual_seed(seed)
    model = CloverMoeForCausalLM(tiny_config(**overrides)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("A_log", "dt_bias", "logit_scale", "history_bias", "history_c")):
                continue
            if "conv_right_weight" in name and not block_params:
                continue
            p.normal_(0.0, scale)
    return model



TINY_MASK = 127  # the tiny config's mask id (its last vocabulary entry)


def random_ids(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    """[batch, length] token ids of the tiny vocabulary, never the mask."""
    return torch.randint(0, TINY_MASK, (batch, length), generator=torch.Generator().manual_seed(seed))
