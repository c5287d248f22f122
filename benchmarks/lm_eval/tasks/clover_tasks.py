"""lm-eval hooks of the clover tasks (the YAML files beside this one refer to them with `!function`).

Documents come from the JSONL files `task_docs.py` writes into a data folder, given to lm-eval as
metadata: `--metadata '{"data_dir": "DIR"}'` (or `TaskManager(metadata=...)`). A generated answer
is scored by the clover task's own scorer (`Task.score`, what `clover eval` counts), on the example
regenerated from the document's `(task, seed)`.
"""

import json
from pathlib import Path

import datasets


def _load(name: str, data_dir: str | None, task: str | None = None) -> dict:
    if data_dir is None:
        raise ValueError("the clover tasks need metadata 'data_dir' (the folder task_docs.py wrote), "
                         "e.g. --metadata '{\"data_dir\": \"/tmp/clover-lm-eval\"}'")
    path = Path(data_dir) / f"{name}.jsonl"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    if task is not None:
        rows = [r for r in rows if r["task"] == task]
    if not rows:
        raise ValueError(f"{path} holds no documents" + (f" of task {task!r}" if task else ""))
    return {"test": datasets.Dataset.from_list(rows)}


def generate_docs(data_dir: str | None = None, task: str | None = None, **_metadata) -> dict:
    """`custom_dataset` of the generate-until tasks: the documents of one clover task."""
    return _load("generate", data_dir, task)


def choice_docs(data_dir: str | None = None, **_metadata) -> dict:
    """`custom_dataset` of the multiple-choice task."""
    return _load("choice", data_dir)


def score_generation(doc: dict, results: list[str]) -> dict:
    """`process_results` of the generate-until tasks: clover's exact match of the response."""
    from clover.data import get_task

    task = get_task(doc["task"])
    example = task.generate(doc["seed"], "eval")
    if example.prompt != doc["prompt"]:
        raise ValueError(f"document {doc['task']}/{doc['seed']} no longer matches its clover example")
    return {"exact_match": float(task.score(example, results[0])["correct"])}
