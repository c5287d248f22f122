"""The engine's causal modes: how a request of mode "ar" or "self_spec" advances after a forward.

Both run in the engine's shared steps, next to block-diffusion requests, through the same cache
pool slots and prefix cache (the prompt's causal pieces are the same in every mode, so prefix
entries are shared across modes). Only the rows' phases differ (`sequence.py`):

  ar         PREFILL (last prompt piece, causal) -> token; then STEP [token] -> next token, ...
  self_spec  PREFILL -> p; then per iteration (SPEC §7, `clover.model.self_speculative`):
             DRAFT  [pending, p, MASK x (B-1)]: commits `pending`, drafts by argmax (one block pass)
             VERIFY [draft] causal: A accepted; emit draft[0..A]; p = a_A. The forward's cache
                    writes are kept only when all B draft tokens hold (A = B-1); otherwise none are
                    (`RowsCache.commit` with 0 leaves the row's slot, GDN states included, as it
                    was) and draft[0..A] become the next DRAFT's `pending`: the rollback costs no copy.

Token choice, controls, grammar and logprobs are the model package's (`RowDecoder.next_token` /
`verify`), so greedy output equals `model.generate(mode=...)` and self_spec equals ar (C6).
Contract: mixed into `Engine`; runs on the engine thread.
"""

import torch

from clover.model.self_speculative import fill_draft

from .sequence import Phase, Sequence


class CausalSteps:
    """`Engine` methods for the causal modes; uses the engine's `_emit`, `device`, `mask_token_id`."""

    def _verdict(self, seq: Sequence, logits: torch.Tensor) -> tuple:
        """A VERIFY row's acceptance from its logits [B, V], decided before the write-back (it says
        how many positions the row keeps): (`VerifyResult`, logprob entries or None)."""
        return seq.decoder.verify(logits, seq.block, len(seq.generated), seq.generator)

    @staticmethod
    def _kept(seq: Sequence, verdict) -> int:
        """Causal positions a VERIFY row keeps: all B when every draft token holds, else none."""
        return seq.block_size if verdict[0].accepted == seq.block_size - 1 else 0

    def _advance_causal(self, seq: Sequence, logits: torch.Tensor, verdict=None) -> None:
        """logits [K, V] of the row's forward (K = `seq.logits_to_keep`)."""
        if seq.phase in (Phase.PREFILL, Phase.STEP):
            token, entry = seq.decoder.next_token(logits[-1], len(seq.generated), seq.generator)
            if seq.mode == "ar":
                self._ar_token(seq, token, entry)
            else:
                self._open_draft(seq, token, entry)
        elif seq.phase is Phase.DRAFT:
            seq.block, seq.phase = self._draft(seq, logits[1:]), Phase.VERIFY
        else:
            self._accept(seq, *verdict)

    def _draft(self, seq: Sequence, logits: torch.Tensor) -> torch.Tensor:
        """The draft [B] from the block logits [B-1, V] of its masks (tests override this with
        oracle and adversarial drafters, as `self_speculative_steps(drafter=...)` does)."""
        return fill_draft(logits[None], seq.block[None].clone(), self.mask_token_id)[0]

    def _ar_token(self, seq: Sequence, token: int, entry) -> None:
        reason = "stop" if token in seq.params.eos_token_id else None
        if self._emit(seq, [token], None if entry is None else [entry], reason):
            return
        seq.decoder.commit(torch.tensor([token], device=self.device))
        seq.pending, seq.phase = [token], Phase.STEP

    def _open_draft(self, seq: Sequence, token: int, entry) -> None:
        """p = `token` is known: emit it alone when it ends the response, else draft after it."""
        if token in seq.params.eos_token_id or seq.remaining == 1:  # the last token needs no draft
            self._emit(seq, [token], None if entry is None else [entry],
                       "stop" if token in seq.params.eos_token_id else None)
            return
        seq.token, seq.token_logprob = token, entry
        seq.new_block(self.device)
        seq.block[0] = token
        seq.phase = Phase.DRAFT

    def _accept(self, seq: Sequence, result, entries) -> None:
        """Emit draft[0..A] (cut at the first EOS and at max_tokens) and open the next draft."""
        emitted = result.emitted[0].tolist()
        logprobs = None if entries is None else [seq.token_logprob] + entries[:-1]
        eos = [i for i, t in enumerate(emitted) if t in seq.params.eos_token_id]
        end = min(seq.remaining, eos[0] + 1 if eos else len(emitted))
        reason = "stop" if eos and eos[0] < end else None
        if self._emit(seq, emitted[:end], None if logprobs is None else logprobs[:end], reason):
            return
        seq.decoder.commit(result.emitted[0])
        seq.pending = [] if self._kept(seq, (result,)) else emitted  # all kept: the verify wrote exactly them
        self._open_draft(seq, int(result.next_token), None if entries is None else entries[-1])
