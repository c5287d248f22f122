"""Admission and grouping: which sequences run in this step, and in which forwards.

Contract: `submit` and `abort` may be called from any thread; everything else runs on the engine
thread. Waiting requests are admitted between steps, which is a block boundary for every running
sequence (each step ends with whole-block decisions). Rows of one forward must share `block_len`
and, when they have a cache, the number of tokens they append; so a step makes one group per
(phase, block length, logits read, empty cache or not, tokens appended by cached rows): prompt
pieces, prefills, fused commits, denoising steps, and the causal modes' AR steps, drafts and
verifies (`sequence.py`). Requests of different modes therefore share a step, in different forwards.

Step token budget: a step feeds at most `max_step_tokens` prompt tokens (like vLLM's batched-token
budget), shortest remaining prompt first, alongside every denoising and commit row; a long prompt
therefore advances piece by piece while short requests start and finish between its pieces.
"""

import threading
from collections import deque
from dataclasses import dataclass

from .sequence import Phase, Sequence


class QueueFullError(RuntimeError):
    """The waiting queue is at its bound."""


@dataclass(frozen=True)
class SchedulerConfig:
    max_batch_size: int = 32  # running sequences
    max_queue: int = 256  # waiting (not yet admitted) sequences
    max_prefill_tokens: int = 8192  # prompt tokens admitted per step (at least one request)
    prefill_chunk: int = 512  # longest prompt piece in one forward; pieces end on its grid
    max_step_tokens: int = 2048  # prompt tokens fed per step, over all rows (at least 1)

    def __post_init__(self):
        for name in ("max_batch_size", "max_queue", "max_prefill_tokens", "prefill_chunk", "max_step_tokens"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)} must be a positive integer")


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

    def plan_prompt_tokens(self) -> set[int]:
        """Share the step's prompt-token budget, shortest remaining prompt first; returns the ids
        of the sequences that feed prompt tokens this step (the others wait a step)."""
        budget, chosen = self.config.max_step_tokens, set()
        for seq in sorted((s for s in self.running if s.in_prompt), key=lambda s: s.prompt_left):
            tokens = min(seq.next_piece(self.config.prefill_chunk), budget)
            if tokens <= 0:
                break
            seq.plan_prompt_step(tokens)
            budget -= tokens
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
