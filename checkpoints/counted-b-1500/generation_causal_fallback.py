"""The causal fallback of block diffusion (`fallback="causal"`): when no masked position of a block
passes the threshold, ask the causal mode instead of filling the most confident position. With
`fill="prefix"` the step first fills its confident run from the leftmost masked position, and the
causal mode decides every step that leaves positions open, from the first of them.

SPEC §4's rule fills the single most confident masked position when none passes the threshold.
That commit is where block diffusion departs from AR decoding of the same checkpoint
(`benchmarks/departures.py`): nearly always the leftmost masked position, everything to its left
filled, at a confidence of 0.5-0.7 where the causal mode is sure of another token. With this rule,
such a step runs one causal pass over the block, its masked positions filled by the step's own
predictions (`DenoiseResult.guesses`), and from the leftmost masked position m on writes the tokens
the causal mode chooses, for as long as the block agrees with them:

    a_j = choice from the causal logits predicting position j (a_0 from the last committed token),
          under the controls of history = committed + guesses[..j-1], as AR decoding would
    write a_j at every j >= m with guesses[m..j-1] == a_m..a_{j-1}

So position m is always filled, with AR's token given the block's filled prefix (the rule advances
like the fallback it replaces); masked positions the guesses got right are filled too; and the run
ends at the first position where the block disagrees with the causal mode, which takes the causal
token: a guess is replaced, and so is a token an earlier step filled above the threshold (the causal
mode, given a prefix it agrees with, overrules block mode's confident mistake there). The pass is
rolled back from the cache (the block is committed as a whole later) and counts as a forward. With
`threshold=1.0` every step is a fallback and the output is AR decoding's
(`tests/model/test_causal_fallback.py`).
"""

import torch

from .generation_batch import DecodeBatch, RunLog, forward
from .generation_sampling import predict_with_confidence, slot_controls

FALLBACKS = ("confidence", "causal")  # SPEC §4's most confident position, or the causal mode's token


def causal_fallback(model, batch: DecodeBatch, step, last_logits: torch.Tensor, start: int, limit: int, cfg,
                    processors: list, log: RunLog, generator=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The denoising `step` (a `DenoiseResult`), `last_logits` [A, V] the causal logits of the last
    committed token -> (block, filled) after the step, the rows where `step.fallback` completed by
    the causal mode. The causal pass is rolled back from the cache."""
    snapshot, attention_mask = batch.cache.snapshot(), batch.attention_mask
    logits = forward(model, batch, step.guesses, 0, step.guesses.shape[1], cfg, log)  # [A, B, V]: j predicts j + 1
    batch.cache.restore(snapshot)
    batch.attention_mask = attention_mask
    return fallback_fill(logits, last_logits, step, batch, start, limit, cfg, processors,
                         model.config.mask_token_id, generator)


def fallback_fill(logits: torch.Tensor, last_logits: torch.Tensor, step, batch: DecodeBatch, start: int,
                  limit: int, cfg, processors: list, mask_id: int,
                  generator=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The fill from the causal logits [A, B, V] of `step.guesses` (logit j predicts position j + 1);
    `batch` gives the committed history the controls read. With the causal fallback a step fills no
    fallback position itself, so `step.block` is the block before the pass: its own fills (a
    confident run, under the prefix rule) stand, and the run starts after them."""
    block = step.block
    size = block.shape[1]
    logits = torch.cat((last_logits[:, None], logits[:, :-1]), dim=1).float()  # [A, B, V] predicting j
    logits[..., mask_id] = float("-inf")
    before = torch.cat((torch.full_like(step.guesses[:, :1], mask_id), step.guesses[:, :-1]), dim=1)
    logits = slot_controls(logits, batch, before, start, cfg, processors, mask_id)  # slot j: guesses[..j-1]
    masked = block == mask_id
    columns = torch.arange(size, device=block.device)
    chosen, _ = predict_with_confidence(logits, cfg.do_sample, cfg.temperature, cfg.top_k, cfg.top_p,
                                        generator)  # [A, B]: a_j
    first = torch.where(masked.any(-1), masked.int().argmax(-1), size)  # [A]: m
    after = columns >= first[:, None]  # [A, B]
    agree = (step.guesses == chosen) | ~after
    chain = torch.cat((torch.ones_like(agree[:, :1]), agree[:, :-1].int().cumprod(-1).bool()), dim=1)
    run = after & chain & (columns < limit) & step.fallback[:, None]
    written = run & (masked | (chosen != block))  # a filled token the causal mode agrees with stays
    return torch.where(written, chosen, block), written | step.filled  # written only in fallback rows

