"""Autoregressive (causal-mode) decoding of the same checkpoint: the baseline block diffusion is
measured against. One token per forward, with the same controls, sampler and output type; the mask
token is excluded as in block diffusion.
"""

import torch

from .confidence import predict_with_confidence
from .controls import ControlContext, apply_processors, last_marker_state, think_markers, token_counts
from .decode_batch import DecodeBatch, forward, prefill, start_batch
from .events import BlockEvent, DoneEvent, RunLog, StepEvent
from .generation_constraint import choose


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
