"""Token choice: the sampler and its confidence, the generation controls (logits processors) and the
grammar's left-to-right run rule.

Token choice and its confidence (SPEC §4).

Confidence is the probability of the chosen token under the T = 1 softmax of the processed logits
(controls and mask exclusion applied; temperature, top-k and top-p not), so sampling settings never
change what counts as confident.

Generation controls (SPEC §6) as small logits processors, applied in order.

Each processor is a callable `(logits [N, L, V], ctx: ControlContext) -> logits` over N rows and L
slots (the block positions being predicted; L = 1 for AR decoding). The history is the generated
response only: committed tokens plus positions already filled in the current block, counted per
row in `ctx.counts`. Everything is vectorised over rows, slots and vocabulary.

Grammar-constrained decoding: the left-to-right run rule of block diffusion.

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

from dataclasses import dataclass

import torch

def filter_top_k(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep the `top_k` largest logits of each row (0 = off); others become -inf."""
    if top_k <= 0 or top_k >= logits.shape[-1]:
        return logits
    kth = logits.topk(top_k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def filter_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches `top_p` (always >= 1 token)."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    mass_before = probs.cumsum(-1) - probs  # mass of the strictly more likely tokens
    drop_sorted = mass_before >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def sample(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
           generator: torch.Generator | None) -> torch.Tensor:
    """Draw one token per row of logits [..., V] from the tempered, filtered distribution."""
    filtered = filter_top_p(filter_top_k(logits / temperature, top_k), top_p)
    probs = filtered.softmax(-1).reshape(-1, logits.shape[-1])
    return torch.multinomial(probs, 1, generator=generator).view(logits.shape[:-1])


def predict_with_confidence(logits: torch.Tensor, do_sample: bool = False, temperature: float = 1.0,
                            top_k: int = 0, top_p: float = 1.0,
                            generator: torch.Generator | None = None):
    """logits [..., V] (processed) -> (tokens [...] long, confidence [...] float32)."""
    logits = logits.float()
    probs = logits.softmax(-1)
    if do_sample:
        tokens = sample(logits, temperature, top_k, top_p, generator)
    else:
        tokens = logits.argmax(-1)
    return tokens, probs.gather(-1, tokens[..., None]).squeeze(-1)


@dataclass
class ControlContext:
    counts: torch.Tensor  # [N, V] float: occurrences of each token in the row's response history
    positions: torch.Tensor  # [L] response position n (0-based) of each slot, shared by all rows; or [N, L]
    think_open: torch.Tensor | None = None  # [N, L] bool: thinking open before the slot
    last_position: int | None = None  # host copy of max(positions), when known: skips zero ramps
    rows: list[int] | None = None  # original batch row of each of the N rows (user processors)


def control_context(batch, block: torch.Tensor, masked: torch.Tensor, start: int,
                    cfg, columns: torch.Tensor) -> ControlContext:
    """The controls' view of `block` [A, B] of a `DecodeBatch`: history = committed tokens + the
    block's filled positions (not `masked`); slots sit at response positions start + `columns` [K]."""
    filled = ~masked
    counts = batch.counts + token_counts(block.masked_fill(masked, 0), filled, batch.counts.shape[1])
    think_open = None
    if batch.think_open is not None:
        markers = think_markers(block, filled, cfg.think_start_token_id, cfg.think_end_token_id)
        think_open = slot_think_open(markers, batch.think_open)[:, columns]
    return ControlContext(counts, start + columns, think_open, start + block.shape[1] - 1,
                          rows=batch.rows)


def slot_controls(logits: torch.Tensor, batch, tokens: torch.Tensor, start: int, cfg, processors: list,
                  mask_id: int) -> torch.Tensor:
    """Controls on logits [A, B, V] whose slot j predicts response position `start + j`, with history =
    committed + tokens[:, ..j] (`tokens` [A, B]; mask ids in it are not counted): one row per slot.
    A causal pass over a draft or a block reads its logits so, each slot with the tokens before it."""
    if not processors:
        return logits
    rows, size, vocab = logits.shape
    real = tokens != mask_id
    steps = token_counts(tokens.reshape(-1, 1), real.reshape(-1, 1), vocab).view(rows, size, vocab)
    counts = batch.counts[:, None] + steps.cumsum(1)  # [A, B, V]: up to and with slot j's token
    positions = (start + torch.arange(size, device=tokens.device)).repeat(rows)[:, None]  # [A*B, 1]
    think_open = None
    if batch.think_open is not None:
        markers = think_markers(tokens, real, cfg.think_start_token_id, cfg.think_end_token_id)
        markers = torch.cat((markers, markers.new_zeros(rows, 1)), dim=1)
        think_open = slot_think_open(markers, batch.think_open)[:, 1:].reshape(-1, 1)  # after token j: [A*B, 1]
    ctx = ControlContext(counts.view(-1, vocab), positions, think_open, start + size - 1,
                         rows=[row for row in batch.rows for _ in range(size)])
    return apply_processors(processors, logits.view(rows * size, 1, vocab), ctx).view(rows, size, vocab)


def ramp_is_zero(ctx: "ControlContext", start: int, window: int) -> bool:
    """True when the ramp is 0 at every slot (known from the host-side last position, no sync)."""
    if ctx.last_position is None:
        return False
    return ctx.last_position <= start if window > 0 else ctx.last_position < start


def ramp(positions: torch.Tensor, start: int, window: int) -> torch.Tensor:
    """clamp((n - start) / window, 0, 1); a window <= 0 is a step at `start`."""
    n = positions.float()
    if window <= 0:
        return (n >= start).float()
    return ((n - start) / window).clamp(0.0, 1.0)


def per_row(value: torch.Tensor) -> torch.Tensor:
    """A per-slot value [L] (shared by the rows) as [1, L]; one already per row [N, L] as is."""
    return value if value.dim() == 2 else value[None]


def slot_ramp(ctx: ControlContext, start: int, window: int) -> torch.Tensor:
    """The ramp of every slot as [1, L] (positions shared by the rows) or [N, L]."""
    return per_row(ramp(ctx.positions, start, window))


class RepetitionPenalty:
    """A positive logit of a seen token is divided by r, a negative one multiplied by r."""

    def __init__(self, penalty: float):
        self.penalty = penalty

    def __call__(self, logits, ctx):
        seen = (ctx.counts > 0)[:, None, :]  # [N, 1, V]
        penalised = torch.where(logits > 0, logits / self.penalty, logits * self.penalty)
        return torch.where(seen, penalised, logits)


class FrequencyPresencePenalty:
    """logit -= f·count + p·[count > 0]."""

    def __init__(self, frequency: float, presence: float):
        self.frequency, self.presence = frequency, presence

    def __call__(self, logits, ctx):
        penalty = self.frequency * ctx.counts + self.presence * (ctx.counts > 0).to(ctx.counts.dtype)
        return logits - penalty[:, None, :].to(logits.dtype)


class LengthPenalty:
    """Adds L·ramp(n) to every EOS logit, encouraging the answer to end past `start`."""

    def __init__(self, weight: float, start: int, window: int, eos_ids: tuple[int, ...]):
        self.weight, self.start, self.window = weight, start, window
        self.eos_ids = list(eos_ids)

    def __call__(self, logits, ctx):
        if ramp_is_zero(ctx, self.start, self.window):
            return logits
        bonus = self.weight * slot_ramp(ctx, self.start, self.window).to(logits.device)  # [1 or N, L]
        logits = logits.clone()
        logits[:, :, self.eos_ids] += bonus[..., None].to(logits.dtype)
        return logits


class ThinkEndBias:
    """While thinking is open, adds T·ramp(n) to the `</think>` logit."""

    def __init__(self, bias: float, start: int, window: int, think_end_id: int):
        self.bias, self.start, self.window = bias, start, window
        self.think_end_id = think_end_id

    def __call__(self, logits, ctx):
        if ctx.think_open is None or ramp_is_zero(ctx, self.start, self.window):
            return logits
        bonus = self.bias * slot_ramp(ctx, self.start, self.window).to(logits.device)  # [1 or N, L]
        logits = logits.clone()
        logits[:, :, self.think_end_id] += (bonus * ctx.think_open.to(bonus.dtype)).to(logits.dtype)
        return logits


class MinNewTokens:
    """EOS cannot be chosen at response positions before `minimum` (transformers' min_new_tokens)."""

    def __init__(self, minimum: int, eos_ids: tuple[int, ...]):
        self.minimum, self.eos_ids = minimum, list(eos_ids)

    def __call__(self, logits, ctx):
        early = per_row(ctx.positions < self.minimum).to(logits.device)[..., None]  # [1 or N, L, 1]
        logits = logits.clone()
        logits[:, :, self.eos_ids] = logits[:, :, self.eos_ids].masked_fill(early, float("-inf"))
        return logits


def make_logits_processors(cfg) -> list:
    """The active controls of a `DecodeConfig`, in SPEC order; controls at their neutral value are
    left out, and the think-end bias needs both think token ids."""
    processors = []
    if cfg.repetition_penalty != 1.0:
        processors.append(RepetitionPenalty(cfg.repetition_penalty))
    if cfg.frequency_penalty or cfg.presence_penalty:
        processors.append(FrequencyPresencePenalty(cfg.frequency_penalty, cfg.presence_penalty))
    if cfg.dllm_length_penalty and cfg.eos_token_id:
        processors.append(LengthPenalty(cfg.dllm_length_penalty, cfg.dllm_length_penalty_start,
                                        cfg.dllm_length_penalty_window, cfg.eos_token_id))
    if cfg.dllm_think_end_bias and uses_think(cfg):
        processors.append(ThinkEndBias(cfg.dllm_think_end_bias, cfg.dllm_think_end_start,
                                       cfg.dllm_think_end_window, cfg.think_end_token_id))
    if cfg.min_new_tokens and cfg.eos_token_id:
        processors.append(MinNewTokens(cfg.min_new_tokens, cfg.eos_token_id))
    return processors


def uses_think(cfg) -> bool:
    return cfg.think_start_token_id is not None and cfg.think_end_token_id is not None


def apply_processors(processors: list, logits: torch.Tensor, ctx: ControlContext) -> torch.Tensor:
    for processor in processors:
        logits = processor(logits, ctx)
    return logits


# --- history bookkeeping ---------------------------------------------------------------------

def token_counts(tokens: torch.Tensor, weights: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """tokens [N, L], weights [N, L] (1 where the token counts) -> counts [N, V] via scatter_add."""
    counts = torch.zeros(tokens.shape[0], vocab_size, dtype=torch.float, device=tokens.device)
    return counts.scatter_add_(1, tokens, weights.float())


def think_markers(tokens: torch.Tensor, valid: torch.Tensor, start_id: int, end_id: int) -> torch.Tensor:
    """+1 at a valid `<think>`, -1 at a valid `</think>`, 0 elsewhere. tokens, valid [N, L]."""
    markers = (tokens == start_id).long() - (tokens == end_id).long()
    return markers * valid.long()


def last_marker_state(markers: torch.Tensor, before: torch.Tensor) -> torch.Tensor:
    """Thinking open after a span: the last nonzero marker decides, else the state `before` [N]."""
    idx = torch.arange(markers.shape[1], device=markers.device)
    last = torch.where(markers != 0, idx, -1).amax(-1)  # [N]
    value = markers.gather(1, last.clamp(min=0)[:, None]).squeeze(1)
    return torch.where(last >= 0, value > 0, before)


def slot_think_open(markers: torch.Tensor, before: torch.Tensor) -> torch.Tensor:
    """Thinking open before each slot j of a block: the last marker at a position < j decides,
    else the state `before` [N]. markers [N, L] -> [N, L] bool."""
    idx = torch.arange(markers.shape[1], device=markers.device)
    last_upto = torch.where(markers != 0, idx, -1).cummax(-1).values  # last marker at <= j
    last_before = torch.cat((last_upto.new_full((markers.shape[0], 1), -1), last_upto[:, :-1]), dim=1)
    value = markers.gather(1, last_before.clamp(min=0))
    return torch.where(last_before >= 0, value > 0, before[:, None])


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
