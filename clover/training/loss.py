"""The joint objective L = L_AR + α·L_diff (SPEC §8), computed through the inference code path.

Both streams come from the forward calls that decoding makes, on one cache whose tensors keep
their autograd graph, so the noisy-stream logits are the block-mode logits inference would see
given the clean prefix (C7 by construction):

    forward 0:   [prompt, noisy block 0], block_len=B   (prefill + first denoise, fused)
    forward b:   [clean block b-1, noisy block b], block_len=B   (commit + denoise, fused)
    final:       [clean last block], causal   (its commit, for the last L_AR terms)

Causal logits at a token predict the next one (L_AR); block logits at a position predict the
token there (L_diff). Loss only on response targets (EOS padding included).
"""

from contextlib import nullcontext
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from .cache_handle import with_handles
from .copy_attention import (FactTokens, KeyTokens, RecordedAttention, copy_attention_loss, copy_sources,
                             copy_value_loss, fact_line_sources, key_sources)
from .data import Batch
from .line_owner import OwnerTerms, RecordedResiduals, batch_owners, line_owner_loss
from .noising import BlockNoise


@dataclass(frozen=True)
class StreamLogits:
    ar: torch.Tensor  # [N, R, V]: causal logits predicting response token j (clean stream)
    diff: torch.Tensor  # [N, R, V]: block-mode logits at response position j (noisy stream)


@dataclass(frozen=True)
class LossResult:
    total: torch.Tensor  # scalar, l_ar + alpha * l_diff
    l_ar: torch.Tensor  # scalar, mean next-token CE over response targets
    l_diff: torch.Tensor  # scalar, Σ masked CE / t_b over the number of response targets
    num_targets: int  # response tokens with loss (EOS padding included)
    num_masked: int  # of those, masked in the noisy stream
    l_copy: torch.Tensor | None = None  # scalar, the copy supervision's loss (copy_attention.py), when on
    l_owner: torch.Tensor | None = None  # scalar, the line-owner supervision's loss (line_owner.py), when on
    l_value: torch.Tensor | None = None  # scalar, the copy heads' written-token loss (copy_attention.py), when on
    l_fact: torch.Tensor | None = None  # scalar, the fact-line copy supervision's loss, when on
    l_fact_value: torch.Tensor | None = None  # scalar, the fact heads' written-token loss, when on


def stream_logits(model, batch: Batch, noisy_response: torch.Tensor, block_size: int,
                  use_coreset: bool | None = None) -> StreamLogits:
    """Run the fused forward loop. `model` is a `CloverMoeForCausalLM` (not a DDP wrapper);
    `noisy_response` [N, R] is the response with masked positions set to `<|mask|>`."""
    prompt, response = batch.prompt_ids, batch.response_ids
    n, r = response.shape
    b = block_size
    if r == 0 or r % b:
        raise ValueError(f"response length {r} must be a positive multiple of block_size={b}")
    mask = torch.cat((batch.prompt_mask, batch.prompt_mask.new_ones(n, r)), dim=1)  # [N, P + R]
    p = prompt.shape[1]
    cache = with_handles(model.new_cache())  # transparent; keeps FSDP2 from copying layer caches

    def run(ids, block_len, keep=0):
        length = cache.get_seq_length() + ids.shape[1]
        return model(ids, attention_mask=mask[:, :length], past_key_values=cache, block_len=block_len,
                     logits_to_keep=keep, use_coreset=use_coreset).logits

    logits = run(torch.cat((prompt, noisy_response[:, :b]), dim=1), b, keep=b + 1)
    ar, diff = [logits[:, :1]], [logits[:, 1:]]
    for start in range(b, r, b):
        clean_prev, noisy = response[:, start - b:start], noisy_response[:, start:start + b]
        logits = run(torch.cat((clean_prev, noisy), dim=1), b)
        ar.append(logits[:, :b])
        diff.append(logits[:, b:])
    ar.append(run(response[:, r - b:], 0)[:, :-1])
    assert cache.get_seq_length() == p + r
    return StreamLogits(torch.cat(ar, dim=1), torch.cat(diff, dim=1))


def token_ce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy [N, R] of logits [N, R, V] against targets [N, R], in fp32."""
    ce = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="none")
    return ce.view_as(targets)


def loss_divisor(weight: torch.Tensor, normalizer: float | None):
    """The number the summed losses are divided by: the batch's targets, or `normalizer` (a
    data-parallel rank's share of the global number, see the trainer)."""
    return weight.sum().clamp(min=1.0) if normalizer is None else max(float(normalizer), 1e-9)


def joint_loss(logits: StreamLogits, batch: Batch, noise: BlockNoise, block_size: int,
               alpha: float, normalizer: float | None = None) -> LossResult:
    """Sums over the batch's response targets divided by `loss_divisor`."""
    weight = batch.target_mask.float()
    count = loss_divisor(weight, normalizer)
    masked = noise.masked.to(weight.device).float() * weight
    inv_t = 1.0 / noise.per_token_levels(block_size).to(weight.device)
    l_ar = (token_ce(logits.ar, batch.response_ids) * weight).sum() / count
    l_diff = (token_ce(logits.diff, batch.response_ids) * masked * inv_t).sum() / count
    return LossResult(l_ar + alpha * l_diff, l_ar, l_diff, int(batch.target_mask.sum()),
                      int(masked.sum()))


def causal_logits(model, batch: Batch) -> torch.Tensor:
    """[N, R, V] causal logits predicting each response token, from one forward over
    [prompt, response] (no cache): the same values as `stream_logits(...).ar`, computed at once."""
    ids = torch.cat((batch.prompt_ids, batch.response_ids), dim=1)
    mask = torch.cat((batch.prompt_mask, batch.prompt_mask.new_ones(batch.response_ids.shape)), dim=1)
    r = batch.response_ids.shape[1]
    return model(ids, attention_mask=mask, logits_to_keep=r + 1).logits[:, :-1]


def ar_loss(logits: torch.Tensor, batch: Batch, normalizer: float | None = None) -> LossResult:
    """L_AR alone (the α = 0 objective: AR pre-training before joint post-training); divided as
    in `joint_loss`."""
    weight = batch.target_mask.float()
    l_ar = (token_ce(logits, batch.response_ids) * weight).sum() / loss_divisor(weight, normalizer)
    return LossResult(l_ar, l_ar, l_ar.new_zeros(()), int(batch.target_mask.sum()), 0)


class JointLoss(nn.Module):
    """The whole objective as one module, so a DDP wrapper sees one forward per backward.
    With α = 0 only the clean stream is computed, in one causal forward. With `copy_attention` > 0
    the copy supervision's loss (copy_attention.py) over `copy_heads` (all when empty), times that
    weight, joins the total; it points at each copied token's source, or with `key_tokens` at each
    keyed copy's key; with `copy_value` > 0 the loss that those heads write the sourced token joins it
    too, times that weight. With `fact_tokens` and `fact_copy` > 0 a second such term, over
    `fact_heads` with value weight `fact_value`, points joint's fact-line copies at their pilot's
    line (`fact_line_sources`). With `owner_tokens` and `owner_loss` > 0 the line-owner supervision's loss
    (line_owner.py) at decoder layer `owner_layer`, read by `owner_readout`, times that weight, joins it too
    (each fact line's pilot, or with `AskedTokens` each derivation line's asked property, or with
    `RuleFirstTokens` each rule sentence's first condition at its property word); with a tuple of them,
    one such loss each, summed (`l_owner`), at the same layer and weight."""

    def __init__(self, model, block_size: int, alpha: float, use_coreset: bool | None = None,
                 copy_attention: float = 0.0, copy_heads: tuple[tuple[int, int], ...] = (),
                 key_tokens: KeyTokens | None = None, owner_loss: float = 0.0, owner_layer: int = 0,
                 owner_tokens: OwnerTerms | None = None, owner_readout: str = "embedding",
                 copy_value: float = 0.0, fact_copy: float = 0.0, fact_heads: tuple[tuple[int, int], ...] = (),
                 fact_tokens: FactTokens | None = None, fact_value: float = 0.0):
        super().__init__()
        self.model, self.block_size, self.alpha, self.use_coreset = model, block_size, alpha, use_coreset
        self.copy_attention, self.copy_heads, self.key_tokens = copy_attention, copy_heads, key_tokens
        self.owner_loss, self.owner_readout = owner_loss, owner_readout
        if owner_tokens is None:
            owner_tokens = ()
        self.owner_terms = owner_tokens if isinstance(owner_tokens, tuple) else (owner_tokens,)
        if owner_loss and not self.owner_terms:
            raise ValueError("owner_loss needs the fact lines' token ids (owner_tokens)")
        if fact_copy and (fact_tokens is None or not fact_heads):
            raise ValueError("fact_copy needs the fact-line copies' token ids (fact_tokens) and its heads named")
        self.copy_value = copy_value
        self.fact_copy, self.fact_heads, self.fact_tokens = fact_copy, fact_heads, fact_tokens
        self.fact_value = fact_value
        outputs = bool(copy_value or fact_value)  # the value losses read the heads' outputs
        self.recording = RecordedAttention(model, outputs) if copy_attention or fact_copy else None  # reused
        self.o_projs = [layer.o_proj for layer in self.recording.layers] if self.recording else []
        self.residuals = RecordedResiduals(model, owner_layer) if owner_loss else None

    def forward(self, batch: Batch, noise: BlockNoise, normalizer: float | None = None) -> LossResult:
        with self.recording or nullcontext() as recorded, self.residuals or nullcontext() as residuals:
            result = self._objective(batch, noise, normalizer)
        if self.copy_attention:
            sources = copy_sources(batch) if self.key_tokens is None else key_sources(batch, self.key_tokens)
            added, l_copy, l_value = self._copy_term(recorded, batch, sources, self.copy_heads, self.copy_attention,
                                                     self.copy_value)
            result = replace(result, total=result.total + added, l_copy=l_copy, l_value=l_value)
        if self.fact_copy:
            sources = fact_line_sources(batch, self.fact_tokens)
            added, l_fact, l_fact_value = self._copy_term(recorded, batch, sources, self.fact_heads, self.fact_copy,
                                                          self.fact_value)
            result = replace(result, total=result.total + added, l_fact=l_fact, l_fact_value=l_fact_value)
        if self.owner_loss:
            stream, embeddings = torch.cat(residuals, dim=1), self.model.get_input_embeddings().weight
            l_owner = sum(line_owner_loss(stream, batch_owners(batch, tokens), embeddings[list(tokens.classes)],
                                          self.owner_readout) for tokens in self.owner_terms)
            result = replace(result, total=result.total + self.owner_loss * l_owner, l_owner=l_owner)
        return result

    def _copy_term(self, recorded, batch: Batch, sources: torch.Tensor, heads, weight: float, value: float):
        """(weighted sum to add to the total, attention loss, value loss or None when `value` is 0) of one
        copy supervision term over `heads`."""
        prompt_len = batch.prompt_ids.shape[1]
        l_copy = copy_attention_loss(recorded, sources, prompt_len, heads)
        if not value:
            return weight * l_copy, l_copy, None
        l_value = copy_value_loss(recorded, self.recording.outputs, self.o_projs, sources, batch.response_ids,
                                  prompt_len, heads, self.model.get_input_embeddings().weight)
        return weight * l_copy + value * l_value, l_copy, l_value

    def _objective(self, batch: Batch, noise: BlockNoise, normalizer: float | None) -> LossResult:
        if self.alpha == 0:
            return ar_loss(causal_logits(self.model, batch), batch, normalizer)
        noisy = noise.apply(batch.response_ids, self.model.config.mask_token_id)
        logits = stream_logits(self.model, batch, noisy, self.block_size, self.use_coreset)
        return joint_loss(logits, batch, noise, self.block_size, self.alpha, normalizer)
