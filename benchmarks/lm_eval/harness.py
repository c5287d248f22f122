"""lm-eval against a running `clover serve`, through its Python API (what the `lm_eval` command runs):

  generate: local-chat-completions, --apply_chat_template, tasks clover_airspace/joint/record
            (the group clover_generate), one request at a time, the server's default settings;
  choice:   local-completions (token-id prompts, echo + logprobs, max_tokens 1), task
            clover_joint_choice, the checkpoint's tokenizer loaded by lm-eval from its folder.

The equivalent commands (DATA = the folder task_docs.py wrote, URL = http://127.0.0.1:PORT/v1):

  lm_eval --model local-chat-completions --apply_chat_template --tasks clover_generate \\
      --include_path benchmarks/lm_eval/tasks --metadata '{"data_dir": "DATA"}' \\
      --model_args base_url=URL/chat/completions,model=NAME
  lm_eval --model local-completions --tasks clover_joint_choice \\
      --include_path benchmarks/lm_eval/tasks --metadata '{"data_dir": "DATA"}' \\
      --model_args base_url=URL/completions,model=NAME,tokenizer=MODEL_DIR,tokenizer_backend=huggingface
"""

from __future__ import annotations

from pathlib import Path

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
GENERATE_TASKS = ("clover_airspace", "clover_joint", "clover_record")


def _evaluate(model: str, model_args: dict, task: str, data_dir: Path, chat: bool) -> dict:
    import lm_eval
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(TASKS_DIR), metadata={"data_dir": str(data_dir)})
    out = lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=[task], task_manager=manager,
                                  apply_chat_template=chat, log_samples=True, bootstrap_iters=0)
    return out


def generate_scores(base_url: str, name: str, data_dir: Path) -> dict:
    """{"exact_match", "n", "per_task": {clover task: exact match}, "responses"} over the group."""
    out = _evaluate("local-chat-completions", {"base_url": f"{base_url}/chat/completions", "model": name},
                    "clover_generate", data_dir, chat=True)
    per_task, right, n, responses = {}, 0.0, 0, {}
    for task in GENERATE_TASKS:
        samples = sorted(out["samples"][task], key=lambda s: s["doc_id"])
        scores = [s["exact_match"] for s in samples]
        per_task[task.removeprefix("clover_")] = sum(scores) / len(scores)
        right, n = right + sum(scores), n + len(scores)
        responses[task.removeprefix("clover_")] = [s["filtered_resps"][0] for s in samples]
    return {"exact_match": right / n, "n": n, "per_task": per_task, "responses": responses}


def choice_scores(base_url: str, name: str, data_dir: Path, tokenizer_dir: Path) -> dict:
    """{"acc", "n", "loglikelihoods": [[per choice], ...]} of clover_joint_choice (document order)."""
    args = {"base_url": f"{base_url}/completions", "model": name, "tokenizer": str(tokenizer_dir),
            "tokenizer_backend": "huggingface"}
    out = _evaluate("local-completions", args, "clover_joint_choice", data_dir, chat=False)
    samples = sorted(out["samples"]["clover_joint_choice"], key=lambda s: s["doc_id"])
    lls = [[resp[0][0] for resp in s["resps"]] for s in samples]
    return {"acc": out["results"]["clover_joint_choice"]["acc,none"], "n": len(samples), "loglikelihoods": lls}
