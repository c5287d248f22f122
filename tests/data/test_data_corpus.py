"""Training / eval mixtures and their chat formatting."""

from __future__ import annotations

import copy
from collections import Counter

import pytest

from clover.data.corpus import (
    eval_examples,
    format_chat,
    tokenizer_corpus,
    training_examples,
)
from clover.data.tasks import EVAL_TASKS, TASKS, get_task, split_of
from clover.data.tokenizer import train_tokenizer


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(tokenizer_corpus(training_examples(600, seed=2)), vocab_size=3000)


def test_training_mixture_is_balanced_and_reproducible():
    a, b = training_examples(90, seed=3), training_examples(90, seed=3)
    assert a == b
    assert Counter(e.task for e in a) == {name: 30 for name in EVAL_TASKS}
    assert all(split_of(e.prompt) == "train" for e in a)
    assert training_examples(30, seed=4) != training_examples(30, seed=3)[:30]


def test_eval_examples_are_eval_split():
    evals = eval_examples(5, seed=0)
    assert [e.task for e in evals] == [name for name in EVAL_TASKS for _ in range(5)]
    assert all(split_of(e.prompt) == "eval" for e in evals)
    assert evals == eval_examples(5, seed=0)
    train_prompts = {e.prompt for e in training_examples(600, seed=0)}
    assert train_prompts.isdisjoint(e.prompt for e in evals)


def test_format_chat_without_thinking(tok):
    ex = training_examples(1, seed=0)[0]
    prompt, answer = format_chat(tok, ex)
    assert prompt == (f"<|im_start|>user\n{ex.prompt}<|im_end|>\n"
                      "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert answer == ex.answer + "<|im_end|>"
    full = tok.encode(prompt + answer, add_special_tokens=False)
    assert tok.decode(full) == prompt + answer and full[-1] == tok.eos_token_id


def test_format_chat_with_thinking(tok):
    ex = training_examples(1, seed=0)[0]
    chat = format_chat(tok, ex, enable_thinking=True)
    assert chat.prompt.endswith("<|im_start|>assistant\n")
    assert chat.answer == f"<think>\n{ex.reasoning}\n</think>\n\n" + ex.answer + "<|im_end|>"


def test_format_chat_unset_thinking_follows_the_template(tok):
    """None is the template's default, read from the prompt it renders: this template thinks by
    default; one that closes the think block by default gives a direct answer."""
    ex = training_examples(1, seed=0)[0]
    assert format_chat(tok, ex, enable_thinking=None) == format_chat(tok, ex, enable_thinking=True)
    off_by_default = copy.deepcopy(tok)
    off_by_default.chat_template = tok.chat_template.replace(
        "enable_thinking is defined and enable_thinking is false", "not (enable_thinking is defined and enable_thinking)")
    assert off_by_default.chat_template != tok.chat_template
    assert format_chat(off_by_default, ex, enable_thinking=None) == format_chat(tok, ex, enable_thinking=False)
    assert format_chat(off_by_default, ex, enable_thinking=True) == format_chat(tok, ex, enable_thinking=True)


@pytest.mark.parametrize("task", ["airspace", "joint"])
def test_thinking_answer_is_what_the_template_renders_for_the_reasoning(tok, task):
    """The trained think block is the template's rendering of an assistant turn whose
    ``reasoning_content`` is the example's reasoning (record has none: an empty block)."""
    assert get_task("record").generate(5, "train").reasoning == ""
    ex = get_task(task).generate(5, "train")
    assert ex.reasoning
    chat = format_chat(tok, ex, enable_thinking=True)
    turns = [{"role": "user", "content": ex.prompt},
             {"role": "assistant", "content": ex.answer, "reasoning_content": ex.reasoning}]
    rendered = tok.apply_chat_template(turns, tokenize=False)
    assert rendered.startswith(chat.prompt + chat.answer), (rendered, chat)


def test_record_answers_are_long(tok):
    lengths = [len(tok.encode(e.answer, add_special_tokens=False)) for e in eval_examples(20) if e.task == "record"]
    assert min(lengths) > 32


def test_default_prompts_are_short(tok):
    lengths = [len(tok.encode(format_chat(tok, e).prompt, add_special_tokens=False)) for e in eval_examples(50)]
    assert max(lengths) < 400 and sum(lengths) / len(lengths) < 300


def test_curriculum_tasks_stay_out_of_evaluation():
    assert "copy" in TASKS and "copy" not in EVAL_TASKS
    assert set(EVAL_TASKS) == {"airspace", "joint", "record"}


@pytest.mark.parametrize("task", ["airspace", "joint"])
def test_reasoning_off_draws_the_same_examples_with_an_empty_think_block(tok, task):
    """`reasoning=False` (the recipes before stage 5) changes nothing but the think block: same
    prompts and answers for the same seeds, and thinking-mode text with the empty block."""
    on, off = get_task(task), get_task(task, reasoning=False)
    for seed in range(5):
        a, b = on.generate(seed, "train"), off.generate(seed, "train")
        assert (a.prompt, a.answer, a.meta) == (b.prompt, b.answer, b.meta)
        assert a.reasoning and b.reasoning == ""
        assert format_chat(tok, b, enable_thinking=True).answer == "<think>\n\n</think>\n\n" + b.answer + "<|im_end|>"


def test_clean_output_keeps_only_the_answer():
    """The answer follows a closed think block; a think block that never closes holds no answer
    (the server returns such a response with empty content), even if it mentions one."""
    from clover.data.tasks.base import clean_output

    assert clean_output("<think>\nx\n</think>\n\n1:yes 2:no<|im_end|>") == "1:yes 2:no"
    assert clean_output("1:yes<|endoftext|>junk") == "1:yes"
    assert clean_output("<think>\n1. Is Kim licensed? Kim is licensed. yes 1:yes") == ""
