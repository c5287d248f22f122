"""One request's decoding step, from the model package's batched decoding pieces: a block-diffusion
step (`step`, `status`, `commit`), an AR token (`next_token`) or a self-speculative verify (`verify`).

`clover.model.generation_block_diffusion.denoise_step` / `block_status`, and
`clover.model.generation_autoregressive.next_token` / `accept_draft` / `append_history` with the
history bookkeeping of `generation_batch.start_batch`, work on a batch sharing one setting and one
response position; in the server every row has its own settings, position and generator, so each
row is a batch of one here. Contract: `RowDecoder` is owned by the engine thread.
"""

from dataclasses import dataclass

import torch

from clover.model.generation_autoregressive import VerifyResult, accept_draft, append_history, next_token
from clover.model.generation_batch import DecodeBatch, start_batch
from clover.model.generation_block_diffusion import block_status, denoise_step
from clover.model.generation_causal_fallback import fallback_fill
from clover.model.generation_config import DecodeConfig
from clover.model.generation_sampling import make_logits_processors


@dataclass
class BlockResult:
    tokens: list[int] | None  # the block's response tokens once it is final, else None
    finish_reason: str | None  # "stop" (EOS), "length", or None to go on


# A committed token's log-probability and its `top` alternatives [(token id, logprob), ...], taken
# from the step that filled it (the processed distribution its confidence was read from).
TokenLogprob = tuple[float, list[tuple[int, float]]]


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, top: int) -> list[TokenLogprob]:
    """logits [N, V], targets [N] -> per row the target's log-probability and the `top` most likely
    (token id, logprob) alternatives."""
    logprobs = logits.float().log_softmax(-1)  # [N, V]
    chosen = logprobs.gather(-1, targets[:, None]).squeeze(-1)  # [N]
    values, alt = logprobs.topk(min(top, logprobs.shape[-1]), dim=-1)  # [N, k]
    return [(lp, list(zip(i, v))) for lp, i, v in zip(chosen.tolist(), alt.tolist(), values.tolist())]


class LastLogits:
    """A logits processor placed after all others: keeps the processed logits [1, B, V] it sees."""

    def __init__(self):
        self.logits: torch.Tensor | None = None

    def __call__(self, logits, ctx):
        self.logits = logits
        return logits


@dataclass
class RowDecoder:
    cfg: DecodeConfig
    processors: list
    history: DecodeBatch  # counts / thinking state of the committed response (its cache is unused)
    eos: torch.Tensor  # [E]
    mask_token_id: int
    top_logprobs: int | None = None  # None: no logprobs; else alternatives reported per token
    recorder: LastLogits | None = None
    block_logprobs: dict[int, TokenLogprob] | None = None  # block position -> its fill-time logprob
    constraint: object = None  # the response_format's grammar matcher (None: free text)

    @classmethod
    def start(cls, model, prompt_ids: list[int], cfg: DecodeConfig, top_logprobs: int | None = None,
              grammar=None) -> "RowDecoder":
        ids = torch.tensor([prompt_ids], dtype=torch.long, device=model.device)
        history = start_batch(model, ids, torch.ones_like(ids), cfg)
        eos = torch.tensor(cfg.eos_token_id, dtype=torch.long, device=model.device)
        processors, recorder = make_logits_processors(cfg), None
        if top_logprobs is not None:
            recorder = LastLogits()
            processors = processors + [recorder]
        constraint = None if grammar is None else grammar.constraint()
        return cls(cfg, processors, history, eos, model.config.mask_token_id, top_logprobs, recorder, {},
                   constraint)

    @property
    def constraints(self) -> list | None:
        """The grammar constraint per row, as the model's decoding steps take it (None: free text)."""
        return None if self.constraint is None else [self.constraint]

    def step(self, logits: torch.Tensor, block: torch.Tensor, start: int, limit: int,
             generator: torch.Generator | None):
        """logits [B, V], block [B] -> the denoising step (a `DenoiseResult` of one row: its `block`
        [1, B] is the block after it, positions < limit); with a grammar, a left-to-right run
        (`clover.model.generation_sampling`). A step that `needs_check` is not final: its fill
        comes from `check`."""
        step = denoise_step(logits[None], block[None], self.history, start, limit, self.cfg, self.processors,
                            self.mask_token_id, generator, constraints=self.constraints)
        if self.recorder is not None:  # with a causal pass to come, the confident run it keeps
            self._record(step.block[0], step.filled[0])
        return step

    def needs_check(self, step) -> bool:
        """With fallback="causal", a step that filled no position above the threshold (with
        fill="prefix": that left positions open after its confident run) waits for a causal pass
        over its guesses (`clover.model.generation_causal_fallback`)."""
        return self.cfg.fallback == "causal" and bool(step.fallback[0])

    def check(self, logits: torch.Tensor, last_logits: torch.Tensor, step, start: int, limit: int,
              generator: torch.Generator | None) -> torch.Tensor:
        """The causal logits [B, V] of `step.guesses`, `last_logits` [V] of the last committed token
        -> the block [B] after the step, completed by the causal mode."""
        new, filled = fallback_fill(logits[None], last_logits[None], step, self.history, start, limit, self.cfg,
                                    self.processors, self.mask_token_id, generator)
        if self.recorder is not None:  # the positions the causal pass wrote (the step recorded its confident run)
            self.recorder.logits = self.recorder.logits.view(1, new.shape[1], -1)  # one row per slot there
            self._record(new[0], filled[0] & ~step.filled[0])
        return new[0]

    def _record(self, block: torch.Tensor, filled: torch.Tensor) -> None:
        """Log-probabilities of the tokens this step filled, under the step's processed logits."""
        positions = filled.nonzero().flatten()  # [F]
        entries = token_logprobs(self.recorder.logits[0, positions], block[positions], self.top_logprobs)
        self.block_logprobs.update(zip(positions.tolist(), entries))

    def take_logprobs(self, length: int) -> list[TokenLogprob] | None:
        """The logprobs of the block's first `length` tokens (the committed ones); resets the block."""
        if self.recorder is None:
            return None
        taken = [self.block_logprobs[p] for p in range(length)]
        self.block_logprobs = {}
        return taken

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
        """Fold a full committed block (or any committed tokens [N]) into the history the controls read."""
        append_history(self.history, block[None], self.cfg)

    def next_token(self, logits: torch.Tensor, position: int,
                   generator: torch.Generator | None) -> tuple[int, TokenLogprob | None]:
        """logits [V] of the last position -> the token at response `position` (AR's rule, with
        the grammar when there is one) and its logprob entry when asked for."""
        token = next_token(logits.view(1, 1, -1), self.history, position, self.cfg, self.processors,
                           self.mask_token_id, generator, self.constraints)  # [1, 1]
        entry = None
        if self.recorder is not None:
            entry = token_logprobs(self.recorder.logits.view(1, -1), token.view(1), self.top_logprobs)[0]
        return int(token), entry

    def verify(self, logits: torch.Tensor, draft: torch.Tensor, position: int,
               generator: torch.Generator | None) -> tuple[VerifyResult, list[TokenLogprob] | None]:
        """The causal logits [B, V] of `draft` [B] (draft[0] at response `position`) -> the
        acceptance (SPEC §7) and, when asked for, the logprob entries of draft[1..A] and of the
        bonus token a_A (A + 1 entries, under the AR distribution they were chosen from)."""
        result, processed = accept_draft(logits[None], self.history, draft[None], position, self.cfg,
                                         self.processors, self.mask_token_id, generator)  # processed [1, B, V]
        if self.recorder is None:
            return result, None
        chosen = torch.cat((result.emitted[0, 1:], result.next_token[0]))  # [A + 1]: a_0..a_A
        return result, token_logprobs(processed[0, :chosen.shape[0]], chosen, self.top_logprobs)


def prompt_logprobs(model, prompt_ids: list[int], top: int, chunk: int) -> list[TokenLogprob | None]:
    """Each prompt token's log-probability given the tokens before it, with its `top` most likely
    alternatives (None for the first token, which has no context): one causal pass (block_len 0)
    over the prompt, fed in pieces of at most `chunk` tokens through a cache so that only a piece's
    logits [1, chunk, V] exist at a time. The model's raw causal distribution: controls, penalties
    and temperature shape what is sampled, and a prompt is not sampled."""
    ids = torch.tensor([prompt_ids], dtype=torch.long, device=model.device)  # [1, P]
    cache, out = model.new_cache(), [None]
    fed = ids[:, :-1]  # the last token's logits predict nothing in the prompt
    for start in range(0, fed.shape[1], chunk):
        piece = fed[:, start:start + chunk]  # [1, L]
        mask = torch.ones(1, start + piece.shape[1], dtype=torch.long, device=model.device)
        logits = model(piece, attention_mask=mask, past_key_values=cache, block_len=0).logits  # [1, L, V]
        out += token_logprobs(logits[0], ids[0, start + 1:start + 1 + piece.shape[1]], top)
    return out

