"""The documents of the lm-eval tasks in `tasks/`, from clover's own held-out eval prompts.

  * generate: one document per `clover eval` prompt (`eval_examples(limit, seed)`: the same
    prompts, in the same order), `{"task", "seed", "prompt", "answer"}`; the lm-eval side scores a
    response with the task's own scorer, after regenerating the example from `(task, seed)`.
  * choice: one document per yes/no item of each held-out `joint` prompt: the context is the chat
    prompt with thinking off (an empty think block: the gold reasoning would state every answer)
    and the gold answer up to that item's value, e.g.
    `...<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n1:yes 2:`; the choices are "yes"
    and "no". Scored by likelihood (lm-eval's `multiple_choice`), so it needs prompt logprobs.

Each is written as one JSONL file per name into a data folder that the task files read
(`clover_tasks.load_docs`, given the folder as lm-eval metadata `data_dir`).
"""

from __future__ import annotations

import json
from pathlib import Path

from clover.data import EVAL_TASKS, eval_examples, format_chat, get_task
from clover.data.corpus import SEED_STRIDE

CHOICE_TASK = "joint"
GENERATE = "generate"
CHOICE = "choice"


def generate_docs(limit: int, seed: int = 0, tasks: tuple[str, ...] = EVAL_TASKS) -> list[dict]:
    """`limit` eval prompts of each task: exactly `clover eval --limit {limit} --seed {seed}`'s."""
    docs = []
    for name in tasks:
        task = get_task(name)
        for i in range(limit):
            example = task.generate(seed * SEED_STRIDE + i, "eval")
            docs.append({"task": name, "seed": seed * SEED_STRIDE + i, "prompt": example.prompt,
                         "answer": example.answer})
    expected = eval_examples(limit, seed=seed, tasks=[get_task(n) for n in tasks])
    if [d["prompt"] for d in docs] != [e.prompt for e in expected]:
        raise RuntimeError("the documents' prompts are not clover eval's (eval_examples changed its seeds?)")
    return docs


def choice_docs(tokenizer, limit: int, seed: int = 0) -> list[dict]:
    """One yes/no document per item of `limit` held-out joint prompts (see the module docstring)."""
    task, docs = get_task(CHOICE_TASK), []
    for example in eval_examples(limit, seed=seed, tasks=[task]):
        chat = format_chat(tokenizer, example, enable_thinking=False)  # no reasoning: it states the answers
        shift = chat.answer.rindex(example.answer)
        for item, (_, start, end) in enumerate(task.field_spans(example), 1):
            value = example.answer[start:end]
            if value not in ("yes", "no"):
                raise RuntimeError(f"joint item {item} of {example.answer!r} is {value!r}, not yes/no")
            docs.append({"context": chat.prompt + chat.answer[:shift + start], "choices": ["yes", "no"],
                         "gold": 0 if value == "yes" else 1, "item": item})
    return docs


def write_docs(directory: Path, docs: dict[str, list[dict]]) -> Path:
    """Write `{name: documents}` as `directory/{name}.jsonl`; returns `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, rows in docs.items():
        with open(directory / f"{name}.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    return directory
