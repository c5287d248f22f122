"""`CloverMoeForCausalLM`: embed -> decoder layers (GDN or gated attention, then MoE) -> norm -> head.

Forward contract (SPEC §3.3): the last `block_len` tokens of `input_ids` form a block (block mode:
bidirectional inside the block, predicts the token at each position itself); every token before
them runs causally (predicts the next token) and is appended to `past_key_values` when given.

Which CPU matmul kernel a one-token forward uses in bf16.

PyTorch runs reduced-precision CPU matmuls through oneDNN. For a single row (a decode step: one
token, one sequence) oneDNN's bf16 kernel streams the weights at about half the memory bandwidth on
this project's x86 AVX-512-BF16 CPU, while PyTorch's own kernel (a GEMV with fp32 accumulation)
reaches it: 3.5 against 6.7 GB/s on a 1 GB lm_head, 2.9 against 5.6 GB/s on expert-sized matrices
(one thread, runs interleaved; benchmarks/real_width.py measures the whole step). From 8 rows up
oneDNN is ~3x faster, so only one-row forwards switch. The plain path (oneDNN on) is the twin; a
test compares the two. The switch is PyTorch's process-wide `torch.backends.mkldnn.enabled` flag,
held for the duration of the forward (a forward runs on one thread; another thread's CPU matmul
during it would run on PyTorch's kernel: the same result at a different speed).
"""

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.utils import ModelOutput

from .attention import GatedAttention, RotaryEmbedding
from .cache import CloverCache
from .checkpoint_io import CheckpointMixin
from .configuration_clover_moe import CloverMoeConfig
from .gated_delta_net import GatedDeltaNet
from .generation import BlockDiffusionGenerationMixin
from .moe import SparseMoeBlock
from .norms import RMSNorm

def prefers_native_gemv(rows: int, dtype: torch.dtype, device: torch.device) -> bool:
    """True for a one-row bf16 forward on CPU (where PyTorch's own GEMV beats oneDNN's)."""
    return rows == 1 and dtype == torch.bfloat16 and device.type == "cpu" and torch.backends.mkldnn.is_available()


@contextmanager
def matmul_kernels(rows: int, dtype: torch.dtype, device: torch.device) -> Iterator[None]:
    """While active, CPU matmuls of a `rows`-row forward in `dtype` run on the faster kernel."""
    if not prefers_native_gemv(rows, dtype, device) or not torch.backends.mkldnn.enabled:
        yield
        return
    torch.backends.mkldnn.enabled = False
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = True


@dataclass
class CloverOutput(ModelOutput):
    logits: torch.Tensor | None = None  # [B, T_kept, vocab]
    past_key_values: CloverCache | None = None
    distinct_experts: torch.Tensor | None = None  # [num_layers, B]: experts the block used (block mode)


class DecoderLayer(nn.Module):
    def __init__(self, config: CloverMoeConfig, layer_idx: int):
        super().__init__()
        self.kind = config.layer_types[layer_idx]
        if self.kind == "linear_attention":
            self.linear_attn = GatedDeltaNet(config)
        else:
            self.self_attn = GatedAttention(config)
        self.mlp = SparseMoeBlock(config)
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, x, rotary, key_is_real, cache, block_len, coreset_top_p):
        t = x.shape[1]
        h = self.input_layernorm(x)
        if self.kind == "linear_attention":
            h = self.linear_attn(h, key_is_real[:, -t:], cache, block_len)
        else:
            h = self.self_attn(h, rotary, key_is_real, cache, block_len, t - block_len)
        x = x + h
        h, counts = self.mlp(self.post_attention_layernorm(x), block_len, coreset_top_p)
        return x + h, counts


class CloverMoePreTrainedModel(PreTrainedModel):
    config_class = CloverMoeConfig
    config: CloverMoeConfig
    base_model_prefix = "model"
    _no_split_modules = ["DecoderLayer"]
    _keys_to_ignore_on_load_unexpected = [r"^mtp.*"]
    _supports_sdpa = True

    @torch.no_grad()
    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.normal_(0.0, std)
            if getattr(module, "bias", None) is not None:
                module.bias.zero_()
        elif isinstance(module, nn.Conv1d):
            module.weight.normal_(0.0, std)
        elif isinstance(module, RMSNorm):
            module.weight.zero_()
        elif isinstance(module, GatedDeltaNet):
            module.dt_bias.fill_(1.0)
            module.A_log.copy_(torch.empty_like(module.A_log).uniform_(0.01, 16).log())
            module.conv_right_weight.zero_()
            module.logit_scale.fill_(module.head_k_dim ** 0.5)
            module.history_bias.zero_()
            module.history_c.fill_(1.0)
        elif hasattr(module, "gate_up_proj"):
            module.gate_up_proj.normal_(0.0, std)
            module.down_proj.normal_(0.0, std)
        elif module.__class__.__name__ == "Router":
            module.weight.normal_(0.0, std)
        elif module.__class__.__name__ == "RMSNormGated":
            module.weight.fill_(1.0)


class CloverMoeModel(CloverMoePreTrainedModel):
    def __init__(self, config: CloverMoeConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        rope = config.rope_parameters
        self.rotary_emb = RotaryEmbedding(config.head_dim, rope.get("partial_rotary_factor", 1.0),
                                          rope["rope_theta"])
        self.post_init()

    def forward(self, input_ids, attention_mask=None, past_key_values=None, block_len=0,
                position_ids=None, coreset_top_p=None):
        bsz, t = input_ids.shape
        past = 0 if past_key_values is None else past_key_values.get_seq_length()
        if attention_mask is None:
            attention_mask = torch.ones(bsz, past + t, dtype=torch.long, device=input_ids.device)
        if attention_mask.shape[1] != past + t:
            raise ValueError(f"attention_mask covers {attention_mask.shape[1]} positions; expected "
                             f"cached {past} + new {t} = {past + t}")
        key_is_real = attention_mask.bool()
        if position_ids is None:
            position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -t:]
        x = self.embed_tokens(input_ids)
        rotary = self.rotary_emb(position_ids, x.dtype)
        caches = [None] * len(self.layers) if past_key_values is None else past_key_values.layers
        counts = []
        for layer, cache in zip(self.layers, caches):
            x, c = layer(x, rotary, key_is_real, cache, block_len, coreset_top_p)
            counts.append(c)
        if past_key_values is not None:
            past_key_values.seq_length += t - block_len
        experts = torch.stack(counts) if block_len else None
        return self.norm(x), experts


class CloverMoeForCausalLM(CheckpointMixin, BlockDiffusionGenerationMixin, CloverMoePreTrainedModel):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: CloverMoeConfig):
        super().__init__(config)
        self.model = CloverMoeModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def new_cache(self, capacity: int = 0) -> CloverCache:
        """An empty cache: growing (differentiable) by default, pooled with `capacity` positions."""
        return CloverCache(self.config.layer_types, capacity)

    def forward(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None = None,
                past_key_values: CloverCache | None = None, use_cache: bool | None = None,
                block_len: int | None = None, position_ids: torch.LongTensor | None = None,
                logits_to_keep: int | torch.Tensor = 0, use_coreset: bool | None = None,
                coreset_top_p: float | None = None, **kwargs) -> CloverOutput:
        """input_ids [B, T]; attention_mask [B, cached + T] (0 on left padding).

        `use_cache=True` without a cache starts one. `logits_to_keep=n` computes logits for the last
        n positions only (0 = all); a 1-D LongTensor selects those input positions. The coreset applies to block tokens when enabled in the config
        (or by `use_coreset`); `coreset_top_p` overrides the config's mass."""
        block_len = int(block_len or 0)
        if not 0 <= block_len <= input_ids.shape[1]:
            raise ValueError(f"block_len={block_len} must be in [0, {input_ids.shape[1]}] (input length)")
        if use_cache and past_key_values is None:
            past_key_values = self.new_cache()
        enabled = self.config.moe_block_coreset_enabled if use_coreset is None else use_coreset
        top_p = (coreset_top_p or self.config.moe_block_coreset_top_p) if enabled else None
        weight = self.lm_head.weight
        with matmul_kernels(input_ids.numel(), weight.dtype, weight.device):  # one token: the GEMV kernel
            hidden, experts = self.model(input_ids, attention_mask, past_key_values, block_len,
                                         position_ids, top_p)
            if isinstance(logits_to_keep, torch.Tensor):  # positions of the input (transformers' convention)
                hidden = hidden[:, logits_to_keep.to(hidden.device)]
            elif logits_to_keep:
                hidden = hidden[:, -logits_to_keep:]
            logits = self.lm_head(hidden)
        return CloverOutput(logits=logits, past_key_values=past_key_values, distinct_experts=experts)
