"""`clover train RECIPE --plan`: per-rank memory of a training run before launching it.

An estimate from the config alone (the model is built on the meta device), per rank, in bytes:

- parameters: fp32 master weights, 4·P/W under FSDP (W ranks), 4·P under DDP;
- gradients: fp32, sharded like the parameters;
- optimizer: AdamW's two fp32 moments, 8·P/W (FSDP) or 8·P (DDP);
- gathered: FSDP's working set of whole tensors in the compute dtype: the root (embeddings, head,
  final norm; kept gathered through the step) plus two decoder layers (the running one and the
  prefetched one) with their unsharded gradients;
- activations: the rank's share of the batch, one prompt + two response streams (clean and noisy)
  of `tokens = batch/W · (prompt + 2·response)`. With activation checkpointing each layer keeps
  its input (`hidden` values per token) and one layer's inside is live during recompute; without,
  every layer keeps its inside (`layer_width` values per token: norms, mixer projections, router,
  the top-k experts' and the shared expert's hidden units). Plus the caches (attention keys and
  values of the clean stream; a GDN state per block forward) and the logits of both response
  streams (compute dtype, an fp32 copy for the cross-entropy, and its gradient).
Allocator slack, communication buffers and fragmentation are not included: keep ~10-15% headroom.
"""

from dataclasses import dataclass

GiB = 1024 ** 3


@dataclass(frozen=True)
class MemoryPlan:
    world_size: int
    strategy: str
    parameters: int
    gradients: int
    optimizer: int
    gathered: int
    activations: int

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer + self.gathered + self.activations


def _sizes(config) -> tuple[int, int, int]:
    """(all parameters, the largest decoder layer's, the root's: embeddings + head + norm)."""
    from clover.info import meta_model

    model = meta_model(config)
    total = sum(p.numel() for p in model.parameters())
    layer = max(sum(p.numel() for p in layer.parameters()) for layer in model.model.layers)
    return total, layer, total - sum(p.numel() for p in model.model.layers.parameters())


def layer_width(c) -> int:
    """Values a decoder layer keeps per token for its backward (an estimate, see the docstring)."""
    attention = c.num_attention_heads * c.head_dim * 4 + c.num_key_value_heads * c.head_dim * 2
    gdn_key, gdn_value = c.linear_num_key_heads * c.linear_key_head_dim, c.linear_num_value_heads * c.linear_value_head_dim
    gdn = 4 * gdn_key + 5 * gdn_value
    moe = c.num_experts + c.num_experts_per_tok * 3 * c.moe_intermediate_size + 3 * c.shared_expert_intermediate_size
    return 6 * c.hidden_size + max(attention, gdn) + moe


def memory_plan(config, world_size: int, strategy: str, batch_size: int, prompt_len: int,
                response_len: int, block_size: int, dtype: str = "bf16",
                activation_checkpointing: bool = True) -> MemoryPlan:
    total, layer, root = _sizes(config)
    shards = world_size if strategy == "fsdp" else 1
    act = 2 if dtype == "bf16" else 4
    rows = max(1, batch_size // world_size)
    tokens = rows * (prompt_len + 2 * response_len)
    gathered = (root + 2 * layer) * act * 2 if strategy == "fsdp" else 0
    n_layers = config.num_hidden_layers
    if activation_checkpointing:
        inside = rows * (prompt_len + block_size) * layer_width(config) * act  # the largest forward
        layers = tokens * config.hidden_size * act * n_layers + inside
    else:
        layers = tokens * layer_width(config) * act * n_layers
    n_attention = sum(kind == "full_attention" for kind in config.layer_types)
    kv = rows * (prompt_len + response_len) * 2 * config.num_key_value_heads * config.head_dim * act * n_attention
    state = (config.linear_num_value_heads * config.linear_key_head_dim * config.linear_value_head_dim * 4)
    gdn = rows * state * (response_len // block_size + 1) * (n_layers - n_attention)
    logits = rows * 2 * response_len * config.vocab_size * (act + 4 + 4)
    return MemoryPlan(world_size, strategy, 4 * total // shards, 4 * total // shards, 8 * total // shards,
                      gathered, layers + kv + gdn + logits)


def format_plan(plans: list[MemoryPlan], gpu_gib: tuple[float, ...], header: str) -> str:
    cols = ("ranks", "strategy", "params", "grads", "optim", "gathered", "activ.", "total")
    lines = [header, "  ".join(f"{c:>8}" for c in cols) + "  " + "  ".join(f"fits {g:g} GB" for g in gpu_gib)]
    for p in plans:
        cells = [str(p.world_size), p.strategy] + [f"{v / GiB:.1f}" for v in (
            p.parameters, p.gradients, p.optimizer, p.gathered, p.activations, p.total)]
        fits = ["yes" if p.total <= 0.9 * g * 1e9 else "no" for g in gpu_gib]
        lines.append("  ".join(f"{c:>8}" for c in cells) + "  " + "  ".join(f"{f:>10}" for f in fits))
    lines.append("GiB per rank; 'fits' leaves 10% of the GPU's memory for allocator slack and buffers.")
    return "\n".join(lines)
