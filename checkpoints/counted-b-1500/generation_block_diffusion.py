"""Low-confidence block diffusion (SPEC §4), batched: `denoise_step`, `block_status`,
`commit_block` and the step generator `block_diffusion_steps`.

Batching design (synchronous blocks): every active row works on the same block index. Each
forward denoises every row's current block; a row whose block is complete waits, unchanged, until
every row's block is complete (its logits are ignored: a full block has no masked position, so
extra steps cannot change it). Then all rows commit together, fused with the first denoising step
of the next block. A row that finishes (first EOS, or `max_new_tokens`) leaves the batch at once.
Each row's tokens therefore depend only on its own prompt (C4).

Per step there is one small host sync (which rows are done); nothing loops over positions.
"""

from dataclasses import dataclass
from typing import NamedTuple

import torch

from .generation_batch import BlockEvent, DecodeBatch, DoneEvent, RunLog, StepEvent, forward, prefill, start_batch
from .generation_causal_fallback import causal_fallback
from .generation_sampling import (apply_processors, commit_run, control_context, last_marker_state,
                                  predict_with_confidence, think_markers, token_counts)

class DenoiseResult(NamedTuple):
    block: torch.Tensor  # [A, B] after the step; mask id where still masked
    filled: torch.Tensor  # [A, B] bool: positions this step filled
    confidence: torch.Tensor  # [A, B] each candidate position's confidence at this step (-1 elsewhere)
    guesses: torch.Tensor  # [A, B] the step's block with every position it read filled by its prediction
    fallback: torch.Tensor  # [A] bool: the fallback decides the row (`denoise_step`)


# Which masked positions above the threshold a step fills: all of them (SPEC §4), or only those whose
# block positions to the left are all filled, before or by this step (`filled_prefix`).
FILL_RULES = ("threshold", "prefix")


def filled_prefix(fill: torch.Tensor, masked: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """`fill` [A, K] (over block positions `columns`) kept only where every block position to its left
    is filled already or by `fill` itself: the run that extends the block's filled prefix. `masked`
    [A, B]: the block's masked positions before the step."""
    resolved = ~masked
    resolved[:, columns] |= fill
    return fill & resolved.int().cumprod(-1).bool()[:, columns]


@dataclass
class BlockStatus:
    done: torch.Tensor  # [A] bool: the block needs no more steps
    has_eos: torch.Tensor  # [A] bool: it ends the response with an EOS
    length: torch.Tensor  # [A] long: response tokens it contributes


def denoise_columns(block: torch.Tensor, limit: int, mask_id: int) -> torch.Tensor:
    """The block positions [K] still masked (before `limit`) in any row: the only ones whose
    logits a denoising step reads, so the lm_head runs over these alone."""
    idx = torch.arange(block.shape[1], device=block.device)
    return ((block == mask_id).any(0) & (idx < limit)).nonzero().flatten()


def denoise_step(logits: torch.Tensor, block: torch.Tensor, batch: DecodeBatch, start: int, limit: int,
                 cfg, processors: list, mask_id: int, generator=None,
                 columns: torch.Tensor | None = None, constraints: list | None = None) -> DenoiseResult:
    """One low-confidence step on the blocks [A, B], given the logits [A, K, V] of block positions
    `columns` [K] (default: all B; a position outside `columns` is never filled).

    Fills every masked position before `limit` whose confidence exceeds the threshold (with
    `cfg.fill == "prefix"`, only those that extend the block's filled prefix), or else the single
    most confident one, so every step advances. `fallback` marks the rows where nothing passed and,
    with the prefix rule and the causal fallback, those whose confident run left positions open;
    with the causal fallback the causal pass fills these rows instead of the most confident
    position (`generation_causal_fallback`). `constraints`: None, or one grammar
    constraint (or None) per original batch row; a constrained row fills a left-to-right run
    instead (`generation_sampling.commit_run`)."""
    if columns is None:
        columns = torch.arange(block.shape[1], device=block.device)
    masked = block == mask_id
    sub_block = block[:, columns]  # [A, K]
    candidate = masked[:, columns] & (columns < limit)
    logits = logits.float()
    logits[..., mask_id] = float("-inf")
    logits = apply_processors(processors, logits, control_context(batch, block, masked, start, cfg, columns))
    tokens, confidence = predict_with_confidence(logits, cfg.do_sample, cfg.temperature, cfg.top_k,
                                                 cfg.top_p, generator)
    confidence = confidence.masked_fill(~candidate, -1.0)
    fill = candidate & (confidence > cfg.threshold)
    if cfg.fill == "prefix":
        fill = filled_prefix(fill, masked, columns)
    if cfg.fallback == "causal" and cfg.fill == "prefix":  # the causal pass completes what the run left open
        fallback = (candidate & ~fill).any(-1)
    else:  # nothing passed
        fallback = candidate.any(-1) & ~fill.any(-1)
    if cfg.fallback != "causal":  # SPEC §4: the most confident position (else the causal pass fills the row)
        idx = torch.arange(columns.shape[0], device=block.device)
        fill |= (idx == confidence.argmax(-1, keepdim=True)) & fallback[:, None]
    new_block, filled = block.clone(), torch.zeros_like(masked)
    new_block[:, columns] = torch.where(fill, tokens, sub_block)
    filled[:, columns] = fill
    scores = torch.full(block.shape, -1.0, device=block.device)
    scores[:, columns] = confidence
    guesses = block.clone()
    guesses[:, columns] = torch.where(masked[:, columns], tokens, sub_block)
    if constraints is not None:
        constrain_rows(logits, block, new_block, filled, batch, limit, cfg, mask_id, generator,
                       columns.tolist(), constraints)
        fallback = fallback & torch.tensor([constraints[row] is None for row in batch.rows], device=block.device)
    return DenoiseResult(new_block, filled, scores, guesses, fallback)


def constrain_rows(logits, block, new_block, filled, batch: DecodeBatch, limit: int, cfg, mask_id: int,
                   generator, columns: list[int], constraints: list) -> None:
    """Replace the step of every constrained row by its left-to-right run (in place)."""
    eos = list(cfg.eos_token_id)
    for i, row in enumerate(batch.rows):
        if constraints[row] is None:
            continue
        run = commit_run(logits[i], block[i], columns, limit, mask_id, constraints[row], eos, cfg, generator)
        positions = list(run)
        new_block[i], filled[i] = block[i], False
        new_block[i, positions] = torch.tensor(list(run.values()), dtype=block.dtype, device=block.device)
        filled[i, positions] = True


def block_status(block: torch.Tensor, limit: int, mask_id: int, eos: torch.Tensor) -> BlockStatus:
    """A block is done when an EOS is filled with every position before it filled (the response
    ends there), or when every position before `limit` is filled."""
    idx = torch.arange(block.shape[1], device=block.device)
    masked = (block == mask_id) & (idx < limit)
    first_mask = torch.where(masked.any(-1), masked.int().argmax(-1), limit)
    is_eos = torch.isin(block, eos) & (idx < first_mask[:, None])
    has_eos = is_eos.any(-1)
    length = torch.where(has_eos, is_eos.int().argmax(-1) + 1, limit)
    return BlockStatus(has_eos | (first_mask >= limit), has_eos, length)


class BlockLogits(NamedTuple):
    last: torch.Tensor  # [A, V] causal logits of the last committed token (they predict the block's first)
    block: torch.Tensor  # [A, B, V] block-mode logits of the next block's masks (its first step)


def commit_block(model, batch: DecodeBatch, block: torch.Tensor, cfg, log: RunLog, mask_id: int) -> BlockLogits:
    """Append a finished block to the cache (causal) and return the next block's first logits, with
    the causal logits of the block's last token (the causal fallback's first prediction). Fused: one
    forward over [block, B masks] with block_len=B; unfused: two forwards (C3)."""
    size = block.shape[1]
    masks = torch.full_like(block, mask_id)
    filled = torch.ones_like(block, dtype=torch.bool)
    batch.counts = batch.counts + token_counts(block, filled, batch.counts.shape[1])
    if batch.think_open is not None:
        markers = think_markers(block, filled, cfg.think_start_token_id, cfg.think_end_token_id)
        batch.think_open = last_marker_state(markers, batch.think_open)
    if cfg.fuse_commit:
        logits = forward(model, batch, torch.cat((block, masks), dim=1), size, size + 1, cfg, log)
        return BlockLogits(logits[:, 0], logits[:, 1:])
    last = forward(model, batch, block, 0, 1, cfg, log)
    return BlockLogits(last[:, 0], forward(model, batch, masks, size, size, cfg, log))


def first_block_logits(model, batch, input_ids, attention_mask, cfg, log, mask_id) -> BlockLogits:
    """Prefill, then the first denoising forward (fused into the last prefill chunk by default); with
    the causal logits of the prompt's last token."""
    size = cfg.block_size
    masks = torch.full((input_ids.shape[0], size), mask_id, dtype=torch.long, device=input_ids.device)
    if cfg.fuse_commit:
        logits = prefill(model, batch, input_ids, attention_mask, cfg, log, tail=masks, tail_block_len=size,
                         logits_to_keep=size + 1)
        return BlockLogits(logits[:, 0], logits[:, 1:])
    last = prefill(model, batch, input_ids, attention_mask, cfg, log)
    return BlockLogits(last[:, 0], forward(model, batch, masks, size, size, cfg, log))


def settle_rows(log: RunLog, batch: DecodeBatch, block, status: BlockStatus, waiting: list[bool], k: int,
                start: int, last_block: bool):
    """Record the rows whose block completed at this step and yield their `BlockEvent`s. Returns
    the indices of the rows that stay (unfinished); `waiting` is updated in place."""
    done, has_eos, length = torch.stack((status.done, status.has_eos, status.length)).tolist()
    keep = []
    for i, row in enumerate(batch.rows):
        if not waiting[i]:
            log.rows[row].steps_per_block[k] += 1
        if waiting[i] or not done[i]:
            keep.append(i)
            continue
        finished = bool(has_eos[i]) or last_block
        log.write([row], start, block[i:i + 1])
        log.rows[row].new_tokens += length[i]
        if finished:
            log.rows[row].stop_reason = "eos" if has_eos[i] else "length"
        else:
            waiting[i] = True
            keep.append(i)
        yield BlockEvent(row, k, block[i, :length[i]], finished)
    return keep


def block_diffusion_steps(model, input_ids, attention_mask, cfg, processors, generator=None, constraints=None):
    """Yield a `StepEvent` per denoising forward, a `BlockEvent` per finished block of a row and,
    last, a `DoneEvent` with the `GenerateOutput`. `constraints`: None, or a grammar constraint (or
    None) per row."""
    mask_id, size = model.config.mask_token_id, cfg.block_size
    eos = torch.tensor(cfg.eos_token_id, dtype=torch.long, device=input_ids.device)
    num_blocks = -(-cfg.max_new_tokens // size)
    log = RunLog(input_ids.shape[0], num_blocks * size, cfg.pad_id, input_ids.device)
    batch = start_batch(model, input_ids, attention_mask, cfg)
    last_logits, logits = first_block_logits(model, batch, input_ids, attention_mask, cfg, log, mask_id)
    for k in range(num_blocks):
        start, limit = k * size, min(size, cfg.max_new_tokens - k * size)
        block = torch.full((len(batch.rows), size), mask_id, dtype=torch.long, device=input_ids.device)
        waiting = [False] * len(batch.rows)
        columns = None  # the first step of a block reads every position
        for row in batch.rows:
            log.rows[row].steps_per_block.append(0)
        while True:
            step = denoise_step(logits, block, batch, start, limit, cfg, processors, mask_id, generator,
                                columns, constraints)
            if cfg.fallback == "causal" and step.fallback.any():
                block, filled = causal_fallback(model, batch, step, last_logits, start, limit, cfg, processors,
                                                log, generator)
            else:
                block, filled = step.block, step.filled
            yield StepEvent(list(batch.rows), k, block, filled, step.confidence)
            status = block_status(block, limit, mask_id, eos)
            keep = yield from settle_rows(log, batch, block, status, waiting, k, start, k == num_blocks - 1)
            if len(keep) < len(batch.rows):
                batch, block, last_logits = batch.select(keep), block[keep], last_logits[keep]
                waiting[:] = [waiting[i] for i in keep]
            if not batch.rows or all(waiting):
                break
            columns = denoise_columns(block, limit, mask_id)  # waiting rows ride along
            logits = forward(model, batch, block, size, columns, cfg, log)
        if not batch.rows:
            break
        last_logits, logits = commit_block(model, batch, block, cfg, log, mask_id)
    yield DoneEvent(log.output(input_ids))
