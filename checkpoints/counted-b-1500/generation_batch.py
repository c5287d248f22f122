"""What every decoder shares: the rows still decoding, their forwards, and the events they yield.

Contract: a `DecodeBatch` owns its `CloverCache`; `forward` appends the causal tokens of its input
to the cache and to `attention_mask` (block tokens are seen for this call only). `select` keeps a
subset of rows (finished rows stop costing compute).

What the decoders yield and return: step / block events, per-row statistics, the final output.

Events carry device tensors; the `*_list` helpers and `tokens` copy to the host only when a
consumer asks, so a consumer that ignores step events (e.g. `generate`) costs no extra sync.
"""

from dataclasses import dataclass, field

import torch

from .cache import CloverCache
from .generation_sampling import last_marker_state, think_markers, uses_think

@dataclass
class StepEvent:
    """One denoising forward (block diffusion) or one token step (AR) over the active rows."""

    rows: list[int]  # original batch row of each active row
    block_index: int  # block number (AR: token number)
    block: torch.Tensor  # [A, B] the block after this step; mask id where still masked
    filled: torch.Tensor  # [A, B] bool: positions filled by this step
    # [A, B] block diffusion: each masked position's confidence at this step (-1 where not
    # read), so a filled position below the threshold is the low-confidence rule's fallback (a
    # grammar-constrained row fills a left-to-right run instead); None for AR and self-spec steps
    confidence: torch.Tensor | None = None

    def filled_list(self) -> list[list[tuple[int, int]]]:
        """Per active row, the (position, token) pairs this step filled."""
        block, filled = self.block.tolist(), self.filled.tolist()
        return [[(j, t) for j, (t, f) in enumerate(zip(bt, bf)) if f] for bt, bf in zip(block, filled)]


@dataclass
class BlockEvent:
    """A row's block is final: its new response tokens (first EOS included, nothing after)."""

    row: int
    block_index: int
    token_ids: torch.Tensor  # [n]
    finished: bool  # the row produced its last token

    @property
    def tokens(self) -> list[int]:
        return self.token_ids.tolist()


@dataclass
class RowStats:
    new_tokens: int = 0
    num_forwards: int = 0  # forwards this row took part in, prefill included
    steps_per_block: list[int] = field(default_factory=list)  # denoising steps of each block
    stop_reason: str = ""  # "eos" or "length"

    @property
    def tokens_per_forward(self) -> float:
        return self.new_tokens / max(self.num_forwards, 1)


@dataclass
class GenerateOutput:
    sequences: torch.Tensor  # [N, prompt width + longest response]: right-padded with pad id
    num_forward_passes: int  # every model forward of the call (a fused commit+step counts once)
    num_prefill_forwards: int  # of which prefill chunks (not fused with a denoising step)
    rows: list[RowStats]

    @property
    def new_tokens(self) -> list[int]:
        return [r.new_tokens for r in self.rows]

    @property
    def tokens_per_forward(self) -> float:
        return sum(self.new_tokens) / max(self.num_forward_passes, 1)

    def response_ids(self, row: int, prompt_width: int) -> torch.Tensor:
        """Row `row`'s new tokens [n] (after the prompt columns, before the right padding)."""
        return self.sequences[row, prompt_width:prompt_width + self.rows[row].new_tokens]


@dataclass
class DoneEvent:
    output: GenerateOutput


class RunLog:
    """Bookkeeping of one decoding run: forwards, per-row stats and the response buffer."""

    def __init__(self, num_rows: int, capacity: int, pad_id: int, device):
        self.num_forwards = 0
        self.num_prefill_forwards = 0
        self.rows = [RowStats() for _ in range(num_rows)]
        self.generated = torch.full((num_rows, capacity), pad_id, dtype=torch.long, device=device)
        self.pad_id = pad_id

    def forward(self, rows: list[int], prefill: bool = False) -> None:
        self.num_forwards += 1
        self.num_prefill_forwards += int(prefill)
        for r in rows:
            self.rows[r].num_forwards += 1

    def write(self, rows: list[int], start: int, tokens: torch.Tensor) -> None:
        """tokens [len(rows), L] -> generated[rows, start:start+L] (device copy)."""
        index = torch.tensor(rows, dtype=torch.long, device=self.generated.device)
        self.generated[index, start:start + tokens.shape[1]] = tokens

    def output(self, input_ids: torch.Tensor) -> GenerateOutput:
        lengths = torch.tensor([r.new_tokens for r in self.rows], device=self.generated.device)
        width = int(max(r.new_tokens for r in self.rows))
        response = self.generated[:, :width]
        keep = torch.arange(width, device=response.device)[None] < lengths[:, None]
        response = torch.where(keep, response, torch.full_like(response, self.pad_id))
        sequences = torch.cat((input_ids.to(response.device), response), dim=1)
        return GenerateOutput(sequences, self.num_forwards, self.num_prefill_forwards, self.rows)


@dataclass
class DecodeBatch:
    rows: list[int]  # original batch row of each active row
    cache: CloverCache
    attention_mask: torch.Tensor  # [A, cached]: 1 on real cached positions, 0 on left padding
    counts: torch.Tensor  # [A, V] float: committed response tokens of each row
    think_open: torch.Tensor | None  # [A] bool: thinking open after prompt + committed response

    def select(self, keep: list[int]) -> "DecodeBatch":
        """Keep active rows `keep` (indices into this batch)."""
        index = torch.tensor(keep, dtype=torch.long, device=self.attention_mask.device)
        return DecodeBatch(
            rows=[self.rows[i] for i in keep], cache=self.cache.select_rows(index),
            attention_mask=self.attention_mask.index_select(0, index),
            counts=self.counts.index_select(0, index),
            think_open=None if self.think_open is None else self.think_open.index_select(0, index))


def forward(model, batch: DecodeBatch, input_ids: torch.Tensor, block_len: int, logits_to_keep,
            cfg, log: RunLog, prefill: bool = False, input_mask: torch.Tensor | None = None) -> torch.Tensor:
    """One model forward over the active rows; returns logits [A, K, V] for the last K =
    `logits_to_keep` positions (or the input positions of a 1-D LongTensor `logits_to_keep`).
    `input_mask` [A, T] marks the real new tokens (default: all real)."""
    if input_mask is None:
        input_mask = batch.attention_mask.new_ones(input_ids.shape)
    mask = torch.cat((batch.attention_mask, input_mask.to(batch.attention_mask.dtype)), dim=1)
    out = model(input_ids, attention_mask=mask, past_key_values=batch.cache, block_len=block_len,
                logits_to_keep=logits_to_keep, use_coreset=cfg.use_coreset,
                coreset_top_p=cfg.coreset_top_p)
    batch.attention_mask = mask[:, :mask.shape[1] - block_len]
    log.forward(batch.rows, prefill=prefill)
    return out.logits


def start_batch(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, cfg) -> DecodeBatch:
    """An empty-cache batch of all rows, with the prompt's thinking state."""
    n = input_ids.shape[0]
    think_open = None
    if uses_think(cfg):
        markers = think_markers(input_ids, attention_mask.bool(), cfg.think_start_token_id,
                                cfg.think_end_token_id)
        think_open = last_marker_state(markers, torch.zeros(n, dtype=torch.bool, device=input_ids.device))
    counts = torch.zeros(n, model.config.vocab_size, dtype=torch.float, device=input_ids.device)
    cache = model.new_cache(cache_capacity(input_ids.shape[1], cfg))
    return DecodeBatch(list(range(n)), cache, attention_mask[:, :0].long(), counts, think_open)


def cache_capacity(prompt_width: int, cfg) -> int:
    """Positions a pooled cache needs for any mode: the prompt, every committed block, and one
    block (or draft) of scratch beyond them."""
    size = cfg.block_size
    return prompt_width + -(-cfg.max_new_tokens // size) * size + 2 * size


def prompt_piece_end(done: int, total: int, chunk: int) -> int:
    """End of the next causal prompt piece after `done` of `total` tokens: pieces end at multiples
    of `chunk` (so a piece boundary depends only on the position, which prefix caching relies on),
    the last piece at `total`."""
    return min(total, (done // chunk + 1) * chunk)


def prefill(model, batch: DecodeBatch, input_ids: torch.Tensor, prompt_mask: torch.Tensor, cfg,
            log: RunLog, tail: torch.Tensor | None = None, tail_block_len: int = 0,
            last_is_prefill: bool = True, logits_to_keep: int | None = None) -> torch.Tensor:
    """Causal prefill in chunks of `cfg.prefill_chunk_size` tokens, so attention never sees more
    than chunk × total positions at once. `tail` (e.g. the first block of masks) is appended to the
    last chunk's forward with `tail_block_len`; returns the logits of the last forward's last
    `logits_to_keep` (default `max(1, tail_block_len)`) positions. A forward counts as a prefill
    forward unless it also produces tokens (a fused tail, or `last_is_prefill=False` when its last
    logit is used)."""
    total, done = input_ids.shape[1], 0
    while (end := prompt_piece_end(done, total, cfg.prefill_chunk_size)) < total:
        forward(model, batch, input_ids[:, done:end], 0, 1, cfg, log, prefill=True,
                input_mask=prompt_mask[:, done:end])
        done = end
    last, last_mask = input_ids[:, done:], prompt_mask[:, done:]
    if tail is not None:
        last = torch.cat((last, tail), dim=1)
        last_mask = torch.cat((last_mask, torch.ones_like(tail)), dim=1)
    keep = max(1, tail_block_len) if logits_to_keep is None else logits_to_keep
    return forward(model, batch, last, tail_block_len, keep, cfg, log,
                   prefill=tail is None and last_is_prefill, input_mask=last_mask)
