"""Scheduling: each request's decoding state inside the engine (`Sequence`), and which sequences run
in a step, in which forwards.

Admission and grouping: which sequences run in this step, and in which forwards.

Contract: `submit` and `abort` may be called from any thread; everything else runs on the engine
thread. Waiting requests are admitted between steps, which is a block boundary for every running
sequence (each step ends with whole-block decisions). Rows of one forward must share `block_len`
and, when they have a cache, the number of tokens they append; so a step makes one group per
(phase, block length, logits read, empty cache or not, tokens appended by cached rows): prompt
pieces, prefills, fused commits, denoising steps, and the causal modes' AR steps, drafts and
verifies (`Phase`, below). Requests of different modes therefore share a step, in different forwards.

Step token budget: a step feeds at most `max_step_tokens` prompt tokens (like vLLM's batched-token
budget), shortest remaining prompt first, alongside every denoising and commit row; a long prompt
therefore advances piece by piece while short requests start and finish between its pieces. With
`attention_tokens` A set (the default), a prompt token at context position c counts 1 + c / A
against the budget, since its attention reads c keys: a piece deep into a 32K prompt is cut to about
a tenth of one at its start, so a step's cost, and the wait of the short requests beside it, stays
about the same at any context (`prompt_cost`, `affordable_tokens`).

Prefill share: while other requests decode, the pieces of a long prompt (those that do not finish
it this step) take at most `prefill_share` of the engine's time. The engine reports each step's
seconds in such pieces and in everything else (`account`); while the pieces are over their share
they sit out steps, and each piece is cut to about the time the other rows' forwards took (from the
measured rate of the last pieces; `_timed_piece`). On a CPU a piece of 2,048 tokens costs tens of
short-request steps, and a small one still costs about one (most of a small forward is fixed per-op
cost), so neither a token budget nor the share alone keeps a short request's wait within 2x its
idle time; both together do. Alone, a long prompt takes the whole token budget.

One request's decoding state inside the engine, and what the engine reports back for it.

A `Sequence` is owned by the engine thread. Its phase says what its next forward feeds:

  CHUNK    [prompt piece]                a causal prompt piece of a long prompt (writes the cache)
  PREFILL  [rest of prompt, B masks]     the (last) causal prompt piece + the first block
                                         (mode "ar" / "self_spec": no block; the last logit
                                         gives the first token)
  DENOISE  [block]                       block mode only (reads the cache)
  COMMIT   [finished block, B masks]     fused commit (writes) + next block (SPEC §3.3, C3)
  STEP     [last token]                  mode "ar": causal, writes; its logit gives the next token
  DRAFT    [pending, p, B-1 masks]       mode "self_spec" (SPEC §7): commits the tokens kept by the
                                         last verify that the cache lacks (writes) and drafts a
                                         block after the known next token p (block mode)
  VERIFY   [draft]                       mode "self_spec": causal over the draft; the engine keeps
                                         all B positions if every draft token holds, else none

A prompt is fed in pieces that end on the grid of the chunk size C (`prompt_piece_end`, the rule
`model.generate` uses too), the last one fused with the first block; the scheduler may cut a piece
shorter to keep a step within its prompt-token budget (`step_tokens`). Pieces ending on the grid
are where the prefix cache stores and restores prompt state.
"""

import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from enum import Enum

import torch

from clover.model import CloverCache
from clover.model.generation_batch import prompt_piece_end
from clover.model.generation_config import DecodeConfig

class Phase(Enum):
    CHUNK = "chunk"
    PREFILL = "prefill"
    DENOISE = "denoise"
    COMMIT = "commit"
    STEP = "step"
    DRAFT = "draft"
    VERIFY = "verify"
    CHECK = "check"  # block diffusion with fallback="causal": a causal pass over a fallback step's guesses


@dataclass
class EngineRequest:
    """What the HTTP layer submits: token ids, resolved settings and the sampling seed."""

    request_id: str
    prompt_ids: list[int]
    params: DecodeConfig
    seed: int | None = None
    top_logprobs: int | None = None  # report each token's logprob and this many alternatives (None: off)
    prompt_logprobs: bool = False  # also the prompt tokens' (with `top_logprobs` alternatives), once
    grammar: object = None  # `clover.structured.Grammar` of the response_format (None: free text)
    arrival: float = field(default_factory=time.perf_counter)


@dataclass
class RequestOutput:
    """One report for a request: the tokens of newly committed blocks, cumulative counters, and
    `finish_reason` ("stop", "length", "abort" or "error") on the last report."""

    request_id: str
    new_token_ids: list[int]
    num_generated: int
    num_forwards: int
    finish_reason: str | None = None
    error: str | None = None
    new_logprobs: list | None = None  # per new token: (logprob, [(id, logprob), ...]) when asked for
    prompt_logprobs: list | None = None  # per prompt token (None for the first), on the first report only

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(eq=False)
class Sequence:
    request: EngineRequest
    sink: object  # callable(RequestOutput), thread-safe
    mask_token_id: int
    generator: torch.Generator | None = None
    decoder: object = None  # denoise.RowDecoder, set at admission
    phase: Phase = Phase.PREFILL
    cache: CloverCache | None = None
    block: torch.Tensor | None = None  # [B] current block (self_spec: the draft), mask_token_id where unfilled
    pending: list[int] = field(default_factory=list)  # response tokens the cache still lacks (next forward appends them)
    token: int | None = None  # self_spec: the known next token p that opens the next draft
    token_logprob: object = None  # self_spec: p's logprob entry when logprobs are asked for
    check: object = None  # fallback="causal": the fallback step (`DenoiseResult`) its CHECK resolves
    last_logits: torch.Tensor | None = None  # fallback="causal": causal logits [V] of the last committed token
    prefilled: int = 0  # prompt tokens already in the cache
    step_tokens: int = 0  # prompt tokens this step feeds (set by the scheduler; 0: sits out)
    generated: list[int] = field(default_factory=list)
    num_forwards: int = 0
    admitted_at: float | None = None
    first_block_at: float | None = None
    finished: bool = False  # left the batch (done, failed or aborted)
    prompt_logprobs: list | None = None  # computed at admission when asked for; sent with the first report

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def params(self) -> DecodeConfig:
        return self.request.params

    @property
    def block_size(self) -> int:
        return self.params.block_size

    @property
    def mode(self) -> str:
        return self.params.mode

    @property
    def remaining(self) -> int:
        return self.params.max_new_tokens - len(self.generated)

    @property
    def prompt_left(self) -> int:
        return len(self.request.prompt_ids) - self.prefilled

    @property
    def has_cache(self) -> bool:
        """Whether its cache holds any position (an empty one may be left-padded in a forward)."""
        return self.cache is not None and self.cache.get_seq_length() > 0

    @property
    def in_prompt(self) -> bool:
        return self.phase in (Phase.CHUNK, Phase.PREFILL)

    def next_piece(self, chunk: int) -> int:
        """Length of the next prompt piece on the grid of `chunk`."""
        total = len(self.request.prompt_ids)
        return prompt_piece_end(self.prefilled, total, chunk) - self.prefilled

    def plan_prompt_step(self, tokens: int) -> None:
        """Feed `tokens` prompt tokens this step: PREFILL (with the first block) if they finish the
        prompt, else CHUNK."""
        self.step_tokens = tokens
        self.phase = Phase.PREFILL if tokens == self.prompt_left else Phase.CHUNK

    def next_prompt_phase(self, chunk: int) -> None:
        """CHUNK while more than one piece of the prompt is left, then PREFILL."""
        self.plan_prompt_step(self.next_piece(chunk))

    def causal_input(self, chunk: int) -> list[int]:
        """Tokens this step appends to the cache (before the block, if any)."""
        prompt = self.request.prompt_ids
        if self.in_prompt:
            return prompt[self.prefilled:self.prefilled + self.step_tokens]
        if self.phase in (Phase.COMMIT, Phase.STEP, Phase.DRAFT):
            return self.pending
        if self.phase is Phase.VERIFY:
            return self.block.tolist()
        if self.phase is Phase.CHECK:
            return self.check.guesses[0].tolist()
        return []

    @property
    def appends(self) -> int:
        """Causal tokens this step's forward feeds (rows of a forward with caches must agree)."""
        if self.in_prompt:
            return self.step_tokens
        if self.phase in (Phase.VERIFY, Phase.CHECK):
            return self.block_size
        return 0 if self.phase is Phase.DENOISE else len(self.pending)

    @property
    def block_len(self) -> int:
        """Block positions in this step's input (0 while feeding prompt pieces and in causal modes'
        prefill, step and verify)."""
        if self.phase is Phase.CHUNK or self.phase in (Phase.STEP, Phase.VERIFY, Phase.CHECK):
            return 0
        if self.phase is Phase.PREFILL and self.mode != "block_diffusion":
            return 0
        return self.block_size

    @property
    def logits_to_keep(self) -> int:
        """Logits this step reads: the block's (with fallback="causal", after a prefill or a commit,
        also the last committed token's), the draft's or guesses' (verify, check), else the last
        position's."""
        if self.phase in (Phase.VERIFY, Phase.CHECK):
            return self.block_size
        if self.phase in (Phase.PREFILL, Phase.COMMIT) and self.block_len and self.params.fallback == "causal":
            return self.block_len + 1
        return max(self.block_len, 1)

    def new_block(self, device) -> None:
        self.block = torch.full((self.block_size,), self.mask_token_id, dtype=torch.long, device=device)

    def report(self, new_tokens: list[int], finish_reason: str | None = None, error: str | None = None,
               logprobs: list | None = None):
        prompt_logprobs, self.prompt_logprobs = self.prompt_logprobs, None
        self.sink(RequestOutput(self.request_id, new_tokens, len(self.generated), self.num_forwards,
                                finish_reason, error, logprobs, prompt_logprobs))


class QueueFullError(RuntimeError):
    """The waiting queue is at its bound."""


@dataclass(frozen=True)
class SchedulerConfig:
    max_batch_size: int = 32  # running sequences
    max_queue: int = 256  # waiting (not yet admitted) sequences
    max_prefill_tokens: int = 8192  # prompt tokens admitted per step (at least one request)
    prefill_chunk: int = 512  # longest prompt piece in one forward; pieces end on its grid
    max_step_tokens: int = 2048  # prompt tokens fed per step, over all rows (at least 1)
    attention_tokens: int | None = 2048  # context at which a token's attention costs one more token
    prefill_share: float | None = 1 / 3  # engine time long prompts' pieces may take while others decode (None: all)

    def __post_init__(self):
        for name in ("max_batch_size", "max_queue", "max_prefill_tokens", "prefill_chunk", "max_step_tokens"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)} must be a positive integer")
        if self.attention_tokens is not None and self.attention_tokens <= 0:
            raise ValueError(f"attention_tokens={self.attention_tokens} must be a positive integer or None")
        if self.prefill_share is not None and not 0 < self.prefill_share < 1:
            raise ValueError(f"prefill_share={self.prefill_share} must be in (0, 1), or None for no cap")


def prompt_cost(start: int, tokens: int, attention_tokens: int | None) -> float:
    """Budget used by `tokens` prompt tokens at positions start.. : each counts 1 + position / A."""
    if attention_tokens is None:
        return float(tokens)
    return tokens * (1.0 + (start + (tokens - 1) / 2) / attention_tokens)


MIN_TIMED_PIECE = 128  # prompt tokens a piece keeps however short the other rows' step (`_timed_piece`)


def spend_piece_time(debt: float, piece_s: float, other_s: float, share: float | None) -> float:
    """Piece time over its share after a step that spent `piece_s` seconds in long prompts' pieces
    and `other_s` in everything else (0: within it). Nothing is owed after a step without other
    work: nobody waited for the pieces, and they must not be held back for it later."""
    if share is None or other_s == 0:
        return 0.0
    return max(0.0, debt + piece_s - other_s * share / (1 - share))


def affordable_tokens(start: int, budget: float, attention_tokens: int | None) -> int:
    """The most prompt tokens from position `start` whose `prompt_cost` fits `budget`."""
    if attention_tokens is None:
        return max(int(budget), 0)
    a = attention_tokens
    # n (1 + (start + (n - 1)/2) / a) <= budget  <=>  n^2 / (2a) + n (1 + (start - 1/2) / a) - budget <= 0
    b = 1.0 + (start - 0.5) / a
    n = int(a * (math.sqrt(b * b + 2.0 * budget / a) - b))
    while n > 0 and prompt_cost(start, n, a) > budget:  # float rounding
        n -= 1
    return max(n, 0)


@dataclass
class Group:
    phase: Phase
    block_len: int  # 0 for prompt pieces and causal steps
    seqs: list[Sequence]
    logits_to_keep: int = 1  # last positions whose logits the rows read


class Scheduler:
    def __init__(self, config: SchedulerConfig):
        self.config = config
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._aborted: set[str] = set()
        self._piece_debt = 0.0  # seconds long prompts' pieces ran over `prefill_share` (`account`)
        self._piece_cost = 0.0  # prompt cost of this step's pieces (`prompt_cost`)
        self._piece_rate: float | None = None  # prompt cost per second of the last step's pieces
        self._other_s: float | None = None  # seconds of the last step's other forwards
        self._lock = threading.Lock()
        self.wakeup = threading.Condition(self._lock)

    # -- any thread ---------------------------------------------------------------------------
    def submit(self, seq: Sequence) -> None:
        with self._lock:
            if len(self.waiting) >= self.config.max_queue:
                raise QueueFullError(f"the request queue is full ({self.config.max_queue} waiting)")
            self.waiting.append(seq)
            self.wakeup.notify()

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._aborted.add(request_id)
            self.wakeup.notify()

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    # -- engine thread ------------------------------------------------------------------------
    def wait_for_work(self, timeout: float) -> None:
        with self._lock:
            if not self.waiting and not self.running and not self._aborted:
                self.wakeup.wait(timeout)

    def take_aborted(self) -> list[Sequence]:
        """Remove aborted sequences (waiting or running) and return them."""
        with self._lock:
            ids, self._aborted = self._aborted, set()
            gone = [s for s in self.waiting if s.request_id in ids]
            self.waiting = deque(s for s in self.waiting if s.request_id not in ids)
        gone += [s for s in self.running if s.request_id in ids]
        self.running = [s for s in self.running if s.request_id not in ids]
        return gone

    def admit(self) -> list[Sequence]:
        """Move waiting sequences into the batch, up to the batch and prefill-token bounds."""
        admitted, tokens = [], 0
        with self._lock:
            while self.waiting and len(self.running) < self.config.max_batch_size:
                size = len(self.waiting[0].request.prompt_ids)
                if admitted and tokens + size > self.config.max_prefill_tokens:
                    break
                seq = self.waiting.popleft()
                tokens += size
                self.running.append(seq)
                admitted.append(seq)
        return admitted

    def account(self, piece_s: float, other_s: float) -> None:
        """The engine's report of a step: seconds in long prompts' pieces (CHUNK forwards) and in
        all other forwards."""
        self._piece_debt = spend_piece_time(self._piece_debt, piece_s, other_s, self.config.prefill_share)
        if piece_s > 0 and self._piece_cost > 0:
            self._piece_rate = self._piece_cost / piece_s
        if other_s > 0:
            self._other_s = other_s

    def _timed_piece(self, seq: Sequence, tokens: int) -> int:
        """`tokens` cut so that the piece's forward should take about as long as the other rows'
        forwards did in the last step (measured rate), but not under MIN_TIMED_PIECE tokens."""
        if self._piece_rate is None or self._other_s is None:
            return tokens
        fits = affordable_tokens(seq.prefilled, self._piece_rate * self._other_s, self.config.attention_tokens)
        return min(tokens, max(fits, MIN_TIMED_PIECE))

    def plan_prompt_tokens(self) -> set[int]:
        """Share the step's prompt-token budget, shortest remaining prompt first; returns the ids
        of the sequences that feed prompt tokens this step (the others wait a step). While other
        rows decode, a piece that does not finish its prompt is cut to about their step's time, and
        sits out while such pieces are over their time share (`prefill_share`)."""
        budget, chosen, a = float(self.config.max_step_tokens), set(), self.config.attention_tokens
        decoding = any(not s.in_prompt for s in self.running)
        self._piece_cost = 0.0
        for seq in sorted((s for s in self.running if s.in_prompt), key=lambda s: s.prompt_left):
            tokens = min(seq.next_piece(self.config.prefill_chunk), affordable_tokens(seq.prefilled, budget, a))
            piece = tokens < seq.prompt_left  # leaves some of its prompt for a later step
            if piece and decoding and self.config.prefill_share is not None:
                if self._piece_debt > 0:
                    continue
                tokens = self._timed_piece(seq, tokens)
            if tokens <= 0 and not chosen:
                tokens = 1  # every step feeds at least one prompt token, however deep
            if tokens <= 0:
                break
            seq.plan_prompt_step(tokens)
            cost = prompt_cost(seq.prefilled, tokens, a)
            budget -= cost
            self._piece_cost += cost if seq.phase is Phase.CHUNK else 0.0
            chosen.add(id(seq))
        return chosen

    def groups(self) -> list[Group]:
        """This step's forwards: running sequences grouped by (phase, block length, logits read,
        cached or not, tokens appended by a cached row), in admission order."""
        feeding = self.plan_prompt_tokens()
        groups: dict[tuple, Group] = {}
        for seq in self.running:
            if seq.in_prompt and id(seq) not in feeding:
                continue
            appended = seq.appends if seq.has_cache else 0
            key = (seq.phase, seq.block_len, seq.logits_to_keep, seq.has_cache, appended)
            groups.setdefault(key, Group(seq.phase, seq.block_len, [], seq.logits_to_keep)).seqs.append(seq)
        return list(groups.values())

    def finish(self, seq: Sequence) -> None:
        """Drop a sequence from the batch and let go of its cache (the engine returned a pool slot)."""
        if seq in self.running:
            self.running.remove(seq)
        seq.cache = None
