"""One request's block-diffusion step, from the model package's batched decoding pieces.

`clover.model.block_diffusion.denoise_step` / `block_status` and the history bookkeeping of
`decode_batch.start_batch` / `autoregressive.append_history` work on a batch sharing one setting
and one response position; in the server every row has its own settings, position and generator,
so each row is a batch of one here. Contract: `RowDecoder` is owned by the engine thread.
"""

from dataclasses import dataclass

import torch

from clover.model.autoregressive import append_history
from clover.model.block_diffusion import block_status, denoise_step
from clover.model.controls import make_logits_processors
from clover.model.decode_batch import DecodeBatch, start_batch
from clover.model.generation_config import DecodeConfig


@dataclass
class BlockResult:
    tokens: list[int] | None  # the block's response tokens once it is final, else None
    finish_reason: str | None  # "stop" (EOS), "length", or None to go on


@dataclass
class RowDecoder:
    cfg: DecodeConfig
    processors: list
    history: DecodeBatch  # counts / thinking state of the committed response (its cache is unused)
    eos: torch.Tensor  # [E]
    mask_token_id: int

    @classmethod
    def start(cls, model, prompt_ids: list[int], cfg: DecodeConfig) -> "RowDecoder":
        ids = torch.tensor([prompt_ids], dtype=torch.long, device=model.device)
        history = start_batch(model, ids, torch.ones_like(ids), cfg)
        eos = torch.tensor(cfg.eos_token_id, dtype=torch.long, device=model.device)
        return cls(cfg, make_logits_processors(cfg), history, eos, model.config.mask_token_id)

    def step(self, logits: torch.Tensor, block: torch.Tensor, start: int, limit: int,
             generator: torch.Generator | None) -> torch.Tensor:
        """logits [B, V], block [B] -> the block after one denoising step (positions < limit)."""
        new, _ = denoise_step(logits[None], block[None], self.history, start, limit, self.cfg,
                              self.processors, self.mask_token_id, generator)
        return new[0]

    def status(self, block: torch.Tensor, limit: int) -> BlockResult:
        s = block_status(block[None], limit, self.mask_token_id, self.eos)
        done, has_eos, length = torch.stack((s.done, s.has_eos, s.length)).view(3).tolist()
        if not done:
            return BlockResult(None, None)
        tokens = block[:length].tolist()
        if has_eos:
            return BlockResult(tokens, "stop")
        return BlockResult(tokens, "length" if length < block.shape[0] else None)

    def commit(self, block: torch.Tensor) -> None:
        """Fold a full committed block into the history the controls read."""
        append_history(self.history, block[None], self.cfg)
