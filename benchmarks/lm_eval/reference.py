"""Clover's own scores of the lm-eval documents, in process, to set beside lm-eval's.

  * generate: `clover.evaluation.run.evaluate` (what `clover eval` runs; block diffusion, greedy,
    the checkpoint's generation config and chat-template default) on the same prompts;
  * choice: each choice's log-likelihood from one causal pass of the model over context + choice,
    the continuation split from the context as lm-eval splits it (`_encode_pair`: tokens of the
    whole text past the context's own tokens); the prediction is the likeliest choice.
"""

from __future__ import annotations

import torch


def split_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) as lm-eval's `TemplateLM._encode_pair` makes them."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = tokenizer(context + continuation, add_special_tokens=False).input_ids
    head = len(tokenizer(context, add_special_tokens=False).input_ids)
    return whole[:head], whole[head:]


@torch.inference_mode()
def loglikelihood(model, context_ids: list[int], continuation_ids: list[int]) -> float:
    """Sum of log p(continuation token | everything before it), one causal forward."""
    ids = torch.tensor([context_ids + continuation_ids], device=model.device)  # [1, C + N]
    logits = model(ids, block_len=0).logits[0, len(context_ids) - 1:-1].float()  # [N, V]
    targets = torch.tensor(continuation_ids, device=model.device)  # [N]
    return logits.log_softmax(-1).gather(-1, targets[:, None]).sum().item()


def choice_scores(model, tokenizer, docs: list[dict]) -> dict:
    """{"acc", "n", "loglikelihoods": [[per choice], ...]} of the multiple-choice documents."""
    lls, right = [], 0
    for doc in docs:
        row = [loglikelihood(model, *split_pair(tokenizer, doc["context"], c)) for c in doc["choices"]]
        lls.append(row)
        right += max(range(len(row)), key=lambda i: (row[i], -i)) == doc["gold"]  # first of ties, as argmax
    return {"acc": right / len(docs), "n": len(docs), "loglikelihoods": lls}


def generate_scores(model, tokenizer, limit: int, seed: int = 0) -> dict:
    """`clover eval --no-ar --limit {limit} --seed {seed}`'s accuracy, overall and per task."""
    from clover.data import EVAL_TASKS, eval_examples, get_task
    from clover.evaluation.run import evaluate

    examples = eval_examples(limit, seed=seed, tasks=[get_task(n) for n in EVAL_TASKS])
    report = evaluate(model, tokenizer, examples, with_ar=False, show_progress=False).to_json()
    return {"exact_match": report["accuracy"], "n": report["n"], "per_task": report["per_task_accuracy"]}
