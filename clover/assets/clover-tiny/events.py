"""What the decoders yield and return: step / block events, per-row statistics, the final output.

Events carry device tensors; the `*_list` helpers and `tokens` copy to the host only when a
consumer asks, so a consumer that ignores step events (e.g. `generate`) costs no extra sync.
"""

from dataclasses import dataclass, field

import torch


@dataclass
class StepEvent:
    """One denoising forward (block diffusion) or one token step (AR) over the active rows."""

    rows: list[int]  # original batch row of each active row
    block_index: int  # block number (AR: token number)
    block: torch.Tensor  # [A, B] the block after this step; mask id where still masked
    filled: torch.Tensor  # [A, B] bool: positions filled by this step

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
