"""Grammar-constrained decoding: the left-to-right run rule of block diffusion.

A constraint is a per-row object (e.g. `clover.structured.GrammarConstraint`, over a JSON schema)
with three methods:

    allowed() -> torch.Tensor   bool [V]: tokens the grammar accepts after the committed prefix
    accepts_end() -> bool       the prefix is a complete output (an EOS may end the response here)
    advance(token: int)         consume a committed token (never an EOS)

Rule (a position may be filled only when every position before it in its block is filled, or is
filled in the same step, and the grammar accepts the prefix): in each denoising step the filled
positions form a run starting at the first masked position. Walk from it to the right; mask the
position's processed logits to the grammar's allowed tokens (EOS only where the grammar accepts the
end), choose the token (greedy or sampled, as unconstrained decoding does) and read its confidence
under the masked, renormalised distribution; fill it if the confidence passes the threshold (the
first position of the run always fills, so every step advances), advance the grammar, and go on;
stop at the first position that does not pass, or after an EOS. AR decoding is the same with a run
of one. Contract: `commit_run` masks `logits` in place (so a processor that keeps the processed
logits sees what each confidence was read from) and advances the constraint past the tokens it
fills.
"""

import torch

from .confidence import predict_with_confidence


def allowed_logits(logits: torch.Tensor, constraint, eos: list[int]) -> torch.Tensor:
    """logits [V] -> the same logits with every token the grammar forbids at -inf. When the controls
    have already ruled out every allowed token (e.g. `min_new_tokens` against a complete JSON
    value), the grammar wins: the allowed tokens get equal logits."""
    allowed = constraint.allowed().to(logits.device).clone()  # [V] bool
    allowed[eos] = constraint.accepts_end()
    if not allowed.any():
        raise RuntimeError("the output grammar allows no token here and cannot end (no EOS token is set)")
    masked = logits.masked_fill(~allowed, float("-inf"))
    if not torch.isfinite(masked).any():
        masked = torch.zeros_like(logits).masked_fill(~allowed, float("-inf"))
    return masked


def choose(logits: torch.Tensor, constraint, eos: list[int], cfg, generator) -> tuple[int, float]:
    """Mask logits [V] in place to the grammar; the chosen token and its confidence."""
    logits.copy_(allowed_logits(logits, constraint, eos))
    token, confidence = predict_with_confidence(logits, cfg.do_sample, cfg.temperature, cfg.top_k, cfg.top_p,
                                                generator)
    return int(token), float(confidence)


def commit_run(logits: torch.Tensor, block: torch.Tensor, columns: list[int], limit: int, mask_id: int,
               constraint, eos: list[int], cfg, generator=None) -> dict[int, int]:
    """One row's constrained denoising step. logits [K, V]: the processed logits of block positions
    `columns` (ascending, covering every masked position before `limit`); block [B]. Returns the
    positions filled this step -> their tokens (a left-to-right run from the first masked one)."""
    masked = (block[:limit] == mask_id).nonzero().flatten().tolist()
    if not masked:
        return {}
    if masked != list(range(masked[0], limit)):
        raise ValueError(f"a constrained block must be filled left to right; masked positions {masked}")
    column_of = {position: k for k, position in enumerate(columns)}
    run: dict[int, int] = {}
    for position in range(masked[0], limit):
        token, confidence = choose(logits[column_of[position]], constraint, eos, cfg, generator)
        if run and not confidence > cfg.threshold:
            break
        run[position] = token
        if token in eos:
            break
        constraint.advance(token)
    return run
