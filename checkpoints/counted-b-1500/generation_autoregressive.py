"""Causal-mode decoding: autoregressive (one token per forward) and self-speculative (a block drafted in
block mode, verified causally: AR's output in fewer forwards).

Autoregressive (causal-mode) decoding of the same checkpoint: the baseline block diffusion is
measured against. One token per forward, with the same controls, sampler and output type; the mask
token is excluded as in block diffusion.

Self-speculative decoding (SPEC §7): the same weights draft a block in block mode and verify it
in causal mode; the output is AR's (greedy: token-identical, C6; sampling: the AR distribution, by
exact-match acceptance of tokens sampled from the causal logits).

One iteration, with `p` the known next token (from the prefill, or the previous verify's bonus):

    draft   forward [pending, p, MASK × (B-1)], block_len=B: commits `pending` (the tokens
            accepted last time, not yet in the cache) and predicts the masks; `draft_steps`
            block passes fill by the threshold rule, the last pass fills the rest by argmax
    verify  forward [draft] causal, writing the cache: a_j (chosen from logit j with the controls
            of history + draft[..j]) predicts draft[j+1]
    accept  A = leading matches draft[1..A] == a_0..a_{A-1}; emit draft[0..A]; p = a_A
    rollback unless all B were accepted: restore the snapshot taken before the verify (GDN states
            cannot be cropped); draft[0..A] become the next iteration's `pending`

Rows have different acceptance lengths, so each row decodes as a batch of one (C4 trivially).
"""

from dataclasses import replace
from typing import Callable, NamedTuple

import torch

from .generation_batch import BlockEvent, DecodeBatch, DoneEvent, RunLog, StepEvent, forward, prefill, start_batch
from .generation_block_diffusion import denoise_step
from .generation_sampling import (ControlContext, apply_processors, choose, last_marker_state, predict_with_confidence,
                                  slot_controls, think_markers, token_counts)

def next_token(logits: torch.Tensor, batch: DecodeBatch, position: int, cfg, processors, mask_id,
               generator=None, constraints: list | None = None) -> torch.Tensor:
    """logits [A, 1, V] of the next position -> tokens [A, 1]. `constraints`: None, or a grammar
    constraint (or None) per original row: a constrained row chooses among the allowed tokens (a
    left-to-right run of one) and its constraint advances past the token."""
    logits = logits.float()
    logits[..., mask_id] = float("-inf")
    positions = torch.tensor([position], device=logits.device)
    think_open = None if batch.think_open is None else batch.think_open[:, None]
    logits = apply_processors(processors, logits, ControlContext(batch.counts, positions, think_open, position,
                                                                  rows=batch.rows))
    tokens, _ = predict_with_confidence(logits, cfg.do_sample, cfg.temperature, cfg.top_k, cfg.top_p,
                                        generator)
    for i, row in enumerate(batch.rows if constraints is not None else []):
        if constraints[row] is not None:
            token, _ = choose(logits[i, 0], constraints[row], list(cfg.eos_token_id), cfg, generator)
            tokens[i, 0] = token
            if token not in cfg.eos_token_id:
                constraints[row].advance(token)
    return tokens


def append_history(batch: DecodeBatch, tokens: torch.Tensor, cfg) -> None:
    filled = torch.ones_like(tokens, dtype=torch.bool)
    batch.counts = batch.counts + token_counts(tokens, filled, batch.counts.shape[1])
    if batch.think_open is not None:
        markers = think_markers(tokens, filled, cfg.think_start_token_id, cfg.think_end_token_id)
        batch.think_open = last_marker_state(markers, batch.think_open)


def autoregressive_steps(model, input_ids, attention_mask, cfg, processors, generator=None, constraints=None):
    """Yield a `StepEvent` and a `BlockEvent` per row for every token, then a `DoneEvent`.
    The prefill's last logit gives the first token, so n tokens cost n forwards after the
    prefill chunks before the last."""
    mask_id = model.config.mask_token_id
    eos = torch.tensor(cfg.eos_token_id, dtype=torch.long, device=input_ids.device)
    log = RunLog(input_ids.shape[0], cfg.max_new_tokens, cfg.pad_id, input_ids.device)
    batch = start_batch(model, input_ids, attention_mask, cfg)
    logits = prefill(model, batch, input_ids, attention_mask, cfg, log, last_is_prefill=False)
    for n in range(cfg.max_new_tokens):
        tokens = next_token(logits, batch, n, cfg, processors, mask_id, generator, constraints)
        yield StepEvent(list(batch.rows), n, tokens, torch.ones_like(tokens, dtype=torch.bool))
        log.write(batch.rows, n, tokens)
        is_eos = torch.isin(tokens[:, 0], eos).tolist()
        keep = []
        for i, row in enumerate(batch.rows):
            stats = log.rows[row]
            stats.new_tokens += 1
            stats.steps_per_block.append(1)
            finished = is_eos[i] or n == cfg.max_new_tokens - 1
            if finished:
                stats.stop_reason = "eos" if is_eos[i] else "length"
            else:
                keep.append(i)
            yield BlockEvent(row, n, tokens[i], finished)
        append_history(batch, tokens, cfg)
        if len(keep) < len(batch.rows):
            batch, tokens = batch.select(keep), tokens[keep]
        if not batch.rows:
            break
        logits = forward(model, batch, tokens, 0, 1, cfg, log)
    yield DoneEvent(log.output(input_ids))


# (block logits [1, B-1, V] of the masked draft positions, draft [1, B]) -> the draft, all filled
Drafter = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class VerifyResult(NamedTuple):
    accepted: int  # A: drafted tokens after draft[0] that the causal pass confirmed
    emitted: torch.Tensor  # [1, A + 1] draft[0..A]
    next_token: torch.Tensor  # [1, 1] a_A, the bonus token that opens the next draft


def draft_block(model, batch: DecodeBatch, pending: torch.Tensor, first: torch.Tensor, position: int,
                cfg, processors, log: RunLog, drafter: Drafter | None) -> torch.Tensor:
    """Commit `pending` [1, P] and draft the block [1, B] that starts with `first` [1, 1]."""
    mask_id, size = model.config.mask_token_id, cfg.block_size
    block = torch.cat((first, first.new_full((1, size - 1), mask_id)), dim=1)
    offset = pending.shape[1]
    keep = torch.arange(offset + 1, offset + size, device=block.device)  # the masked positions
    logits = forward(model, batch, torch.cat((pending, block), dim=1), size, keep, cfg, log)
    if drafter is not None:
        return drafter(logits, block)
    greedy = replace(cfg, do_sample=False)  # the draft only affects speed
    columns = torch.arange(1, size, device=block.device)
    for step in range(cfg.draft_steps):
        if step:
            logits = forward(model, batch, block, size, columns, cfg, log)
        if step == cfg.draft_steps - 1:
            break
        block = denoise_step(logits, block, batch, position, size, greedy, processors, mask_id,
                             columns=columns).block
    return fill_draft(logits, block, mask_id)


def fill_draft(logits: torch.Tensor, block: torch.Tensor, mask_id: int) -> torch.Tensor:
    """The draft's last pass: masks of `block` [1, B] still open take the argmax of their block
    logits [1, B-1, V] (positions 1..B-1); the mask token is never drafted."""
    logits = logits.float()
    logits[..., mask_id] = float("-inf")
    rest = block[:, 1:] == mask_id
    block[:, 1:] = torch.where(rest, logits.argmax(-1), block[:, 1:])
    return block


def verify_block(model, batch: DecodeBatch, draft: torch.Tensor, position: int, cfg, processors,
                 log: RunLog, generator=None) -> VerifyResult:
    """Causal pass over the draft (writes the cache) and the exact-match acceptance."""
    logits = forward(model, batch, draft, 0, draft.shape[1], cfg, log)
    return accept_draft(logits, batch, draft, position, cfg, processors, model.config.mask_token_id,
                        generator)[0]


def accept_draft(logits: torch.Tensor, batch: DecodeBatch, draft: torch.Tensor, position: int, cfg,
                 processors, mask_id: int, generator=None) -> tuple[VerifyResult, torch.Tensor]:
    """The exact-match acceptance of `draft` [1, B] from its causal logits [1, B, V]; also returns
    the processed logits [1, B, V] the tokens a_j were chosen from (the AR distribution)."""
    logits = logits.float()
    logits[..., mask_id] = float("-inf")
    logits = slot_controls(logits, batch, draft, position + 1, cfg, processors, mask_id)  # slot j: draft[..j]
    chosen, _ = predict_with_confidence(logits, cfg.do_sample, cfg.temperature, cfg.top_k, cfg.top_p,
                                        generator)  # [1, B]: a_j
    match = (draft[0, 1:] == chosen[0, :-1]).int()
    accepted = int(match.cumprod(0).sum())
    return VerifyResult(accepted, draft[:, :accepted + 1], chosen[:, accepted:accepted + 1]), logits


def keeps_whole_draft(result: VerifyResult, size: int) -> bool:
    """Every draft token holds: the verify's cache writes are exactly the committed tokens."""
    return result.accepted == size - 1


def rollback(batch: DecodeBatch, snapshot, result: VerifyResult, size: int) -> torch.Tensor:
    """Keep the cache only up to what stays committed; returns the tokens still to commit."""
    if keeps_whole_draft(result, size):
        return result.emitted[:, :0]
    batch.cache.restore(snapshot)
    batch.attention_mask = batch.attention_mask[:, :snapshot.get_seq_length()]
    return result.emitted


def first_eos(tokens: torch.Tensor, eos: torch.Tensor) -> int | None:
    hits = torch.isin(tokens[0], eos).nonzero()
    return int(hits[0]) if hits.numel() else None


def decode_row(model, row: int, input_ids, cfg, processors, log: RunLog, generator, drafter):
    """Self-speculative decoding of one prompt [1, T]; yields step and block events."""
    size, eos = cfg.block_size, torch.tensor(cfg.eos_token_id, dtype=torch.long, device=input_ids.device)
    batch = start_batch(model, input_ids, torch.ones_like(input_ids), cfg)
    batch.rows = [row]
    stats = log.rows[row]
    logits = prefill(model, batch, input_ids, torch.ones_like(input_ids), cfg, log, last_is_prefill=False)
    token = next_token(logits, batch, 0, cfg, processors, model.config.mask_token_id, generator)
    pending, n, k = token[:, :0], 0, 0
    while True:
        if n == cfg.max_new_tokens - 1 or torch.isin(token, eos).any():
            result = VerifyResult(0, token, token)  # the last token needs no draft
        else:
            draft = draft_block(model, batch, pending, token, n, cfg, processors, log, drafter)
            snapshot = batch.cache.snapshot()
            result = verify_block(model, batch, draft, n, cfg, processors, log, generator)
            pending = rollback(batch, snapshot, result, size)
        emitted = result.emitted[:, :cfg.max_new_tokens - n]
        stop = first_eos(emitted, eos)
        if stop is not None:
            emitted = emitted[:, :stop + 1]
        finished = stop is not None or n + emitted.shape[1] >= cfg.max_new_tokens
        yield StepEvent([row], k, emitted, torch.ones_like(emitted, dtype=torch.bool))
        log.write([row], n, emitted)
        n, k = n + emitted.shape[1], k + 1
        stats.new_tokens, stats.stop_reason = n, ("eos" if stop is not None else "length") if finished else ""
        stats.steps_per_block.append(1)
        yield BlockEvent(row, k - 1, emitted[0], finished)
        if finished:
            return
        append_history(batch, emitted, cfg)
        token = result.next_token


def self_speculative_steps(model, input_ids, attention_mask, cfg, processors, generator=None,
                           drafter: Drafter | None = None):
    """Yield `StepEvent` / `BlockEvent`s per verify (its emitted tokens), then a `DoneEvent`.
    `drafter` replaces the block-mode draft (tests: oracle and adversarial drafters)."""
    log = RunLog(input_ids.shape[0], cfg.max_new_tokens, cfg.pad_id, input_ids.device)
    for row in range(input_ids.shape[0]):
        prompt = input_ids[row:row + 1, attention_mask[row].bool()]
        yield from decode_row(model, row, prompt, cfg, processors, log, generator, drafter)
    yield DoneEvent(log.output(input_ids))
