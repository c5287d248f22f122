"""One engine step, start to end: `Engine.step` takes the scheduler's groups, runs one forward per
group and advances every row (block diffusion in `Engine._advance`, the causal modes in `CausalSteps`).

The engine: one thread owns the model and runs every request's block diffusion in shared steps.

Design (correctness first: greedy output never depends on the batch, SPEC C4):

* Each request keeps its own cache, a slot of the cache pool (`cache.CachePool`): a pooled batch-1
  `CloverCache` taken at admission, written in place, emptied and reused after the request. A
  step's forward reads its rows' slots in place (`clover.model.cache`): each row attends over
  a view of its own keys (no padding, no copy), GDN states are gathered and written back in place.
  The plain twin, `EngineConfig(cache_pool=False)`, keeps growing per-request caches and stacks
  them every step (`cache.stack_caches`: attention KV left-padded, masked out; GDN states
  concatenated) and splits the written cache back; tests hold the two to the same tokens.
* A forward's rows must share `block_len`, and rows with a cache must append the same number of
  tokens (padding between real tokens would corrupt the GDN state). So one step runs one forward
  per (phase, block size) group:
    - CHUNK    `[left pad, prompt piece]`      prompt pieces of long prompts (`scheduler.Phase`), no block;
    - PREFILL  `[left pad, prompt, B masks]`  new requests: causal prefill (or its last piece)
      fused with their first denoising step (left padding only over empty caches: exact);
    - COMMIT   `[finished block, B masks]`   the fused commit of a finished block and the first
      denoising step of the next one (SPEC §3.3, C3);
    - DENOISE  `[block]`                      a block-mode step; reads the cache, writes nothing;
    - CHECK    `[the step's guesses]`          fallback="causal": the causal pass over a fallback
      step's guesses (`clover.model.generation_causal_fallback`); nothing of it is kept.
  Groups are also split by empty-cache-or-not. With one block size and short prompts that is at
  most three forwards a step; the DENOISE group's batched cache is reused while its rows are
  unchanged and unwritten.
* Each step feeds at most `max_step_tokens` prompt tokens (`scheduler.Scheduler`), so a long prompt does
  not stall the requests decoding next to it, and while others decode a long prompt's pieces take at
  most `prefill_share` of the engine's time.
* Prefix cache (`cache.PrefixCache`): prompt state at piece boundaries is kept (LRU, `prefix_cache_mb`)
  and a request sharing a cached prefix starts with it, prefilling only the rest.
* Requests are admitted between steps (a block boundary for everyone). A request that finishes,
  fails or is aborted (client gone) leaves the batch before the next step and drops its cache.
* Each request samples with its own `torch.Generator`, so sampling is batch-independent too.
* Prompt logprobs (completions' `echo` with `logprobs`): one causal pass over the prompt of its own
  at admission (`denoise.prompt_logprobs`), sent with the request's first report.

Thread contract: `submit` and `abort` may be called from any thread; `sink` callbacks run on the
engine thread and must not block.

The causal modes (`CausalSteps`): how a request of mode "ar" or "self_spec" advances after a forward.

Both run in the engine's shared steps, next to block-diffusion requests, through the same cache
pool slots and prefix cache (the prompt's causal pieces are the same in every mode, so prefix
entries are shared across modes). Only the rows' phases differ (`scheduler.Phase`):

  ar         PREFILL (last prompt piece, causal) -> token; then STEP [token] -> next token, ...
  self_spec  PREFILL -> p; then per iteration (SPEC §7, `clover.model.generation_autoregressive`):
             DRAFT  [pending, p, MASK x (B-1)]: commits `pending`, drafts by argmax (one block pass)
             VERIFY [draft] causal: A accepted; emit draft[0..A]; p = a_A. The forward's cache
                    writes are kept only when all B draft tokens hold (A = B-1); otherwise none are
                    (`RowsCache.commit` with 0 leaves the row's slot, GDN states included, as it
                    was) and draft[0..A] become the next DRAFT's `pending`: the rollback costs no copy.

Token choice, controls, grammar and logprobs are the model package's (`RowDecoder.next_token` /
`verify`), so greedy output equals `model.generate(mode=...)` and self_spec equals ar (C6).
Contract: mixed into `Engine`; runs on the engine thread.
"""

import logging
import os
import threading
import time
from dataclasses import dataclass, field

import torch

from clover.model.cache import RowsCache
from clover.model.configuration_clover_moe import MAX_BLOCK_SIZE
from clover.model.generation_autoregressive import fill_draft, keeps_whole_draft

from .cache import CacheCapacityError, CachePool, PrefixCache, split_cache, stack_caches, stack_inputs
from .denoise import RowDecoder, prompt_logprobs
from .metrics import ServingMetrics
from .scheduler import EngineRequest, Group, Phase, RequestOutput, Scheduler, SchedulerConfig, Sequence

class CausalSteps:
    """`Engine` methods for the causal modes; uses the engine's `_emit`, `device`, `mask_token_id`."""

    def _verdict(self, seq: Sequence, logits: torch.Tensor) -> tuple:
        """A VERIFY row's acceptance from its logits [B, V], decided before the write-back (it says
        how many positions the row keeps): (`VerifyResult`, logprob entries or None)."""
        return seq.decoder.verify(logits, seq.block, len(seq.generated), seq.generator)

    @staticmethod
    def _kept(seq: Sequence, result) -> int:
        """Causal positions a VERIFY row keeps: all B when every draft token holds, else none."""
        return seq.block_size if keeps_whole_draft(result, seq.block_size) else 0

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
        seq.pending = [] if keeps_whole_draft(result, seq.block_size) else emitted
        self._open_draft(seq, int(result.next_token), None if entries is None else entries[-1])


log = logging.getLogger("clover.serve")


@dataclass(frozen=True)
class EngineConfig:
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    idle_wait_s: float = 0.05
    num_threads: int | None = None  # CPU intra-op threads of the engine thread (None: torch's default)
    prefix_cache_mb: float = 256.0  # prompt-prefix cache budget (0 = off)
    cache_pool: bool = True  # False: the plain twin (per-request growing caches, stacked every step)
    slot_tokens: int | None = None  # cache positions one request may use (None: the model's context + scratch)


@dataclass
class Batched:
    """A group's forward cache: `key_mask` [G, cached] (None: all rows empty, twin path) and, on
    the twin path, each row's left padding in front of its cached keys."""

    cache: object  # RowsCache (pool) or a stacked CloverCache (twin)
    key_mask: torch.Tensor | None
    cache_pads: list[int] | None = None


class Engine(CausalSteps):
    def __init__(self, model, tokenizer, config: EngineConfig = EngineConfig(),
                 metrics: ServingMetrics | None = None):
        self.model, self.tokenizer, self.config = model, tokenizer, config
        self.metrics = metrics or ServingMetrics()
        self.scheduler = Scheduler(config.scheduler)
        self.mask_token_id = model.config.mask_token_id
        self.vocab_size = model.config.vocab_size
        self.device = model.device
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else 0
        self._denoise_memo: dict[int, tuple[list, Batched]] = {}  # block size -> (sequences, batched)
        self.prefix_cache = PrefixCache(int(config.prefix_cache_mb * 2 ** 20), config.scheduler.prefill_chunk)
        slot_tokens = config.slot_tokens or model.config.max_position_embeddings + 3 * MAX_BLOCK_SIZE
        self.pool = CachePool(model.new_cache, config.scheduler.max_batch_size, slot_tokens) \
            if config.cache_pool else None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # -- any thread ---------------------------------------------------------------------------
    def submit(self, request: EngineRequest, sink) -> None:
        """Queue a request; `sink(RequestOutput)` receives its reports. Raises `QueueFullError`."""
        generator = None
        if request.params.do_sample:
            seed = request.seed if request.seed is not None else int.from_bytes(os.urandom(7), "little")
            generator = torch.Generator(device=self.device).manual_seed(seed)
        self.scheduler.submit(Sequence(request, sink, self.mask_token_id, generator))
        self.metrics.queue_depth.set(self.scheduler.num_waiting)

    def abort(self, request_id: str) -> None:
        self.scheduler.abort(request_id)

    def start(self) -> "Engine":
        self._thread = threading.Thread(target=self._loop, name="clover-engine", daemon=True)
        self._thread.start()
        return self

    def shutdown(self) -> None:
        self._stop.set()
        with self.scheduler.wakeup:
            self.scheduler.wakeup.notify()
        if self._thread is not None:
            self._thread.join(timeout=10)

    # -- engine thread ------------------------------------------------------------------------
    def _loop(self) -> None:
        if self.config.num_threads:
            torch.set_num_threads(self.config.num_threads)
        with torch.inference_mode():
            while not self._stop.is_set():
                self.scheduler.wait_for_work(self.config.idle_wait_s)
                try:
                    self.step()
                except Exception:  # noqa: BLE001 - the loop must survive anything a step does
                    log.exception("engine step failed")

    def step(self) -> None:
        """Drop aborted requests, admit waiting ones, run one forward per group."""
        for seq in self.scheduler.take_aborted():
            self._finish(seq, "abort")
        for seq in self.scheduler.admit():
            try:
                self._start(seq)
            except CacheCapacityError as e:
                self._finish(seq, "error", error=str(e))
            except Exception as e:  # noqa: BLE001 - a request that cannot start fails alone
                log.exception("request %s could not start", seq.request_id)
                self._finish(seq, "error", error=f"{type(e).__name__} at admission")
        self.metrics.queue_depth.set(self.scheduler.num_waiting)
        self.metrics.running.set(self.scheduler.num_running)
        groups = self.scheduler.groups()
        live = {g.block_len for g in groups if g.phase is Phase.DENOISE}
        self._denoise_memo = {b: v for b, v in self._denoise_memo.items() if b in live}
        if not groups:
            return
        started = time.perf_counter()
        piece_s = other_s = 0.0  # seconds in long prompts' pieces (CHUNK forwards), in everything else
        for group in groups:
            t = time.perf_counter()
            self._run_group_isolated(group)
            elapsed = time.perf_counter() - t
            if group.phase is Phase.CHUNK:
                piece_s += elapsed
            else:
                other_s += elapsed
        self.scheduler.account(piece_s, other_s)
        self.metrics.step_time.observe(time.perf_counter() - started)

    def _run_group_isolated(self, group: Group) -> None:
        """Run a group; if its forward fails, rerun its rows one by one so that only the rows that
        fail alone are failed (per-request caches are untouched until a forward succeeds)."""
        try:
            self._run_group(group)
        except Exception as e:  # noqa: BLE001 - fail these requests, keep serving the rest
            if len(group.seqs) > 1:
                log.warning("batched forward of %d rows failed (%s); retrying them one by one",
                            len(group.seqs), type(e).__name__)
                for seq in group.seqs:
                    self._run_group_isolated(Group(group.phase, group.block_len, [seq]))
                return
            log.exception("forward failed for request %s", group.seqs[0].request_id)
            self._finish(group.seqs[0], "error", error=f"{type(e).__name__} during decoding")

    def _start(self, seq: Sequence) -> None:
        seq.admitted_at = time.perf_counter()
        self.metrics.queue_time.observe(seq.admitted_at - seq.request.arrival)
        prompt = seq.request.prompt_ids
        seq.decoder = RowDecoder.start(self.model, prompt, seq.params, seq.request.top_logprobs,
                                       seq.request.grammar)
        if seq.request.prompt_logprobs:
            seq.prompt_logprobs = prompt_logprobs(self.model, prompt, seq.request.top_logprobs or 0,
                                                  self.config.scheduler.prefill_chunk)
        if self.pool is not None:
            seq.cache = self.pool.acquire(len(prompt), seq.params)
        hit = self.prefix_cache.lookup(prompt)
        if hit.length:
            seq.cache = self.prefix_cache.restore(hit, self.model.new_cache() if seq.cache is None else seq.cache)
        seq.prefilled = hit.length
        self.metrics.prefix_hit_tokens.inc(hit.length)
        self.metrics.prefix_miss_tokens.inc(len(prompt) - hit.length)
        seq.new_block(self.device)
        seq.next_prompt_phase(self.config.scheduler.prefill_chunk)

    def _batch(self, group: Group, pads: list[int]) -> Batched:
        """The group's forward cache; an unchanged DENOISE group reuses the last one (its rows
        were not written since: `_forget` drops it when they are)."""
        seqs = group.seqs
        if group.phase is Phase.DENOISE:
            memo = self._denoise_memo.get(group.block_len)
            if memo is not None and len(memo[0]) == len(seqs) and all(a is b for a, b in zip(memo[0], seqs)):
                return memo[1]
        if self.pool is not None:
            rows = RowsCache([s.cache for s in seqs], pads)
            batched = Batched(rows, rows.key_mask(self.device))
        elif not seqs[0].has_cache:
            batched = Batched(self.model.new_cache(), None, [0] * len(seqs))
        else:
            stacked = stack_caches([s.cache for s in seqs], self.model.new_cache())
            batched = Batched(stacked.cache, stacked.key_mask, stacked.pads)
        if group.phase is Phase.DENOISE:
            self._denoise_memo[group.block_len] = (list(seqs), batched)
        return batched

    def _forget(self, seqs: list[Sequence]) -> None:
        """Drop reused DENOISE batches holding any of `seqs` (written or gone)."""
        ids = {id(s) for s in seqs}
        self._denoise_memo = {b: v for b, v in self._denoise_memo.items() if not any(id(s) in ids for s in v[0])}

    def _run_group(self, group: Group) -> None:
        seqs, b, chunk = group.seqs, group.block_len, self.config.scheduler.prefill_chunk
        causal = [s.causal_input(chunk) for s in seqs]
        inputs = stack_inputs(causal, [s.block if b else s.block[:0] for s in seqs], self.pad_id, self.device)
        batched = self._batch(group, inputs.pads)
        mask = inputs.new_mask if batched.key_mask is None else torch.cat((batched.key_mask, inputs.new_mask), 1)
        out = self.model(inputs.input_ids, attention_mask=mask, past_key_values=batched.cache, block_len=b,
                         logits_to_keep=group.logits_to_keep)
        self.metrics.forward_passes.inc()
        self.metrics.row_forwards.inc(len(seqs))
        appended, verdicts = [len(c) for c in causal], [None] * len(seqs)
        if group.phase is Phase.VERIFY:  # what a verify keeps depends on its acceptance
            for row, seq in enumerate(seqs):
                verdicts[row] = self._guarded(seq, self._verdict, out.logits[row])
                appended[row] = 0 if verdicts[row] is None else self._kept(seq, verdicts[row][0])
        if group.phase is Phase.CHECK:  # a check's causal pass only reads: the cache stays as it was
            appended = [0] * len(seqs)
        if group.phase is not Phase.DENOISE:
            self._write_back(group, batched, inputs.pads, appended)
        for row, seq in enumerate(seqs):
            seq.num_forwards += 1
            if group.phase is Phase.CHUNK or seq.finished:  # a prompt piece: nothing to decode yet
                continue
            if seq.mode == "block_diffusion":
                self._guarded(seq, self._advance, out.logits[row])
            else:
                self._guarded(seq, self._advance_causal, out.logits[row], verdicts[row])

    def _guarded(self, seq: Sequence, fn, *args):
        """`fn(seq, *args)`; if it raises, only `seq` fails (one bad row must not fail the batch)."""
        try:
            return fn(seq, *args)
        except Exception as e:  # noqa: BLE001 - one bad row must not fail the batch
            log.exception("request %s failed", seq.request_id)
            self._finish(seq, "error", error=f"{type(e).__name__} during decoding")
            return None

    def _write_back(self, group: Group, batched: Batched, pads: list[int], appended: list[int]) -> None:
        """Make each row's appended tokens part of its cache; its prompt piece or commit is done."""
        self._forget(group.seqs)
        if self.pool is not None:
            batched.cache.commit(appended)
        else:
            starts = [cp + p for cp, p in zip(batched.cache_pads, pads)]
            owns = split_cache(batched.cache, starts, [self.model.new_cache() for _ in starts])
            for seq, own, n in zip(group.seqs, owns, appended):
                if n:  # a row keeping nothing (a rejected verify) keeps its cache as it was
                    seq.cache = own
        chunk = self.config.scheduler.prefill_chunk
        for seq, n in zip(group.seqs, appended):
            seq.pending = []
            if group.phase in (Phase.CHUNK, Phase.PREFILL):
                seq.prefilled += n
                self.metrics.prompt_tokens.inc(n)
                if group.phase is Phase.CHUNK:
                    self.prefix_cache.store(seq.request.prompt_ids, seq.prefilled, seq.cache)
                    seq.next_prompt_phase(chunk)

    def _advance(self, seq: Sequence, logits: torch.Tensor) -> None:
        """One denoising step on the row's block (or the causal fill of its fallback step, CHECK);
        commit or finish when the block is final."""
        limit, start = min(seq.block_size, seq.remaining), len(seq.generated)
        if seq.phase is Phase.CHECK:
            seq.block = seq.decoder.check(logits, seq.last_logits, seq.check, start, limit, seq.generator)
            seq.check = None
        else:
            if logits.shape[0] > seq.block_size:  # fallback="causal": the last committed token's logits first
                seq.last_logits, logits = logits[0], logits[1:]
            step = seq.decoder.step(logits, seq.block, start, limit, seq.generator)
            if seq.decoder.needs_check(step):
                seq.check, seq.phase = step, Phase.CHECK
                return
            seq.block = step.block[0]
        seq.phase = Phase.DENOISE
        result = seq.decoder.status(seq.block, limit)
        if result.tokens is None:
            return
        tokens, reason = result.tokens, result.finish_reason
        logprobs = seq.decoder.take_logprobs(len(tokens))
        if self._emit(seq, tokens, logprobs, reason):
            return
        seq.decoder.commit(seq.block)
        seq.pending, seq.phase = tokens, Phase.COMMIT
        seq.new_block(self.device)

    def _emit(self, seq: Sequence, tokens: list[int], logprobs: list | None, reason: str | None) -> bool:
        """Hand newly final response tokens to the request, finishing it on `reason` or when its
        budget is spent; returns whether it finished."""
        seq.generated += tokens
        self.metrics.generation_tokens.inc(len(tokens))
        if seq.first_block_at is None:
            seq.first_block_at = time.perf_counter()
            self.metrics.first_block.observe(seq.first_block_at - seq.request.arrival)
        if reason is None and seq.remaining <= 0:
            reason = "length"
        if reason is not None:
            self._finish(seq, reason, tokens, logprobs=logprobs)
            return True
        self._report(seq, tokens, logprobs=logprobs)
        return False

    def _finish(self, seq: Sequence, reason: str, tokens: list[int] | None = None, error: str | None = None,
                logprobs: list | None = None):
        seq.finished = True
        self._forget([seq])  # no batch holding its cache may outlive the request
        if self.pool is not None and seq.cache is not None:
            self.pool.release(seq.cache)
        self.scheduler.finish(seq)
        if seq.num_forwards:
            self.metrics.tokens_per_forward.observe(len(seq.generated) / seq.num_forwards)
        self._report(seq, tokens or [], reason, error, logprobs)

    def _report(self, seq: Sequence, tokens: list[int], reason: str | None = None, error: str | None = None,
                logprobs: list | None = None):
        try:
            seq.report(tokens, reason, error, logprobs)
        except Exception:  # noqa: BLE001 - a broken consumer only loses its own request
            log.exception("could not deliver output of %s; aborting it", seq.request_id)
            if reason is None:
                self.scheduler.abort(seq.request_id)


__all__ = ["Engine", "EngineConfig", "EngineRequest", "RequestOutput"]
