"""Where training pairs come from: the `clover.data` task mixture (tokenized chat turns), or a
built-in digit copy/reverse task that needs no tokenizer (tests, smoke runs).

`clover.data` is imported lazily, inside the functions that use it.
"""

import random
from dataclasses import dataclass

from .data import Pair


@dataclass(frozen=True)
class TokenRoles:
    """The special ids training needs: EOS padding, prompt padding, the mask, and every id that
    counts as an end of response."""
    eos_id: int
    pad_id: int
    mask_id: int
    eos_ids: tuple[int, ...]


# -- digits: a fixed 16-token vocabulary ----------------------------------------------------------

DIGIT_ROLES = TokenRoles(eos_id=1, pad_id=0, mask_id=2, eos_ids=(1, 0))
DIGIT_VOCAB = ("<|endoftext|>", "<|im_end|>", "<|mask|>", "copy", "reverse", "=",
               *(str(d) for d in range(10)))
_OPS = {"copy": 3, "reverse": 4}
_SEP, _DIGIT0 = 5, 6


@dataclass(frozen=True)
class DigitTask:
    """`index -> Pair`: "copy 3 1 4 =" -> "3 1 4 <eos>", "reverse 3 1 4 =" -> "4 1 3 <eos>"."""
    min_len: int = 2
    max_len: int = 8
    seed: int = 0
    ops: tuple[str, ...] = ("copy", "reverse")

    def __call__(self, index: int) -> Pair:
        rng = random.Random(f"digits|{self.seed}|{index}")
        op = rng.choice(self.ops)
        digits = [_DIGIT0 + rng.randrange(10) for _ in range(rng.randint(self.min_len, self.max_len))]
        answer = digits if op == "copy" else digits[::-1]
        return Pair((_OPS[op], *digits, _SEP), (*answer, DIGIT_ROLES.eos_id))

    def pairs(self, start: int, count: int) -> list[Pair]:
        return [self(i) for i in range(start, start + count)]


# -- clover.data tasks ------------------------------------------------------------------------------

def tokenizer_roles(tokenizer, mask_id: int | None = None) -> TokenRoles:
    """Roles from the chat special tokens; `mask_id` (a checkpoint's `mask_token_id`) takes
    precedence over the tokenizer's `<|mask|>`."""
    from clover.data.tokenizer import ENDOFTEXT, IM_END, MASK

    vocab = tokenizer.get_vocab()
    needed = (ENDOFTEXT, IM_END) if mask_id is not None else (ENDOFTEXT, IM_END, MASK)
    missing = [t for t in needed if t not in vocab]
    if missing:
        raise ValueError(f"the tokenizer lacks the special token(s) {missing}")
    mask = vocab[MASK] if mask_id is None else mask_id
    return TokenRoles(eos_id=vocab[IM_END], pad_id=vocab[ENDOFTEXT], mask_id=mask,
                      eos_ids=(vocab[IM_END], vocab[ENDOFTEXT]))


def build_tasks(names=(), options: dict | None = None) -> list:
    """Task objects for `names` (all registered tasks when empty), with per-task options."""
    from clover.data.tasks import get_task, task_names

    options = options or {}
    return [get_task(name, **options.get(name, {})) for name in task_names(names)]


def weighted_tasks(tasks, weights: dict[str, int]) -> list:
    """The round-robin cycle of the training mixture: each task `weights.get(name, 1)` times in a row
    (so a task of weight 2 gives twice as many examples as one of weight 1)."""
    return [task for task in tasks for _ in range(weights.get(task.name, 1))]


def encode_examples(tokenizer, examples, enable_thinking: bool | list[bool] = False) -> list[Pair]:
    """Chat-format each example (user turn + generation prompt; answer + <|im_end|>) and tokenize.
    `enable_thinking` is one mode for all examples or one per example."""
    from clover.data.corpus import format_chat

    modes = enable_thinking if isinstance(enable_thinking, list) else [enable_thinking] * len(examples)
    texts = [format_chat(tokenizer, ex, enable_thinking=mode) for ex, mode in zip(examples, modes)]
    prompts = tokenizer([t.prompt for t in texts], add_special_tokens=False)["input_ids"]
    answers = tokenizer([t.answer for t in texts], add_special_tokens=False)["input_ids"]
    return [Pair(tuple(p), tuple(a)) for p, a in zip(prompts, answers)]


def task_train_pairs(tokenizer, tasks, n: int, seed: int, enable_thinking: bool = False,
                     thinking_fraction: float = 0.0) -> list[Pair]:
    """`n` training pairs; with `thinking_fraction` > 0 that share of them (drawn with `seed`) is
    in thinking mode (the model writes its own think block) and the rest use `enable_thinking`."""
    return task_train_examples(tokenizer, tasks, n, seed, enable_thinking, thinking_fraction)[2]


def task_train_examples(tokenizer, tasks, n: int, seed: int, enable_thinking: bool = False,
                        thinking_fraction: float = 0.0) -> tuple[list, list[bool], list[Pair]]:
    """(the examples, their thinking modes, their pairs) of `task_train_pairs`."""
    from clover.data.corpus import training_examples

    rng = random.Random(f"thinking|{seed}")
    modes = [True if rng.random() < thinking_fraction else enable_thinking for _ in range(n)]
    examples = training_examples(n, seed, tasks)
    return examples, modes, encode_examples(tokenizer, examples, modes)


def task_eval_examples(tasks, n_per_task: int, seed: int) -> list:
    from clover.data.corpus import eval_examples

    return eval_examples(n_per_task, seed, tasks)
