"""Periodic evaluation callbacks for the trainer: `(model, step) -> {metric: value}`.

The trainer calls them on rank 0 in eval mode under `torch.no_grad()`.
"""

from collections.abc import Sequence

import torch

from .data import BatchSpec, Pair
from .loss import joint_loss, stream_logits
from .noising import noise_generator, sample_block_noise
from .sources import encode_examples
from .trainer import EvalFn


def loss_evaluator(pairs: Sequence[Pair], spec: BatchSpec, alpha: float, eps: float,
                   batch_size: int, use_coreset: bool | None = None, seed: int = 0) -> EvalFn:
    """Held-out L_AR / L_diff with fixed noise (the same at every evaluation), token-weighted."""
    batches = [spec.collate(pairs[i:i + batch_size]) for i in range(0, len(pairs), batch_size)]

    def evaluate(model, step: int) -> dict[str, float]:
        device = next(model.parameters()).device
        sums = {"l_ar": 0.0, "l_diff": 0.0, "masked_ce": 0.0}
        targets = masked = 0
        for i, batch in enumerate(batches):
            noise = sample_block_noise(batch.target_mask, spec.block_size, eps,
                                       noise_generator(seed, i, rank=-1))
            batch, noise = batch.to(device), noise.to(device)
            noisy = noise.apply(batch.response_ids, model.config.mask_token_id)
            logits = stream_logits(model, batch, noisy, spec.block_size, use_coreset)
            result = joint_loss(logits, batch, noise, spec.block_size, alpha)
            sums["l_ar"] += result.l_ar.item() * result.num_targets
            sums["l_diff"] += result.l_diff.item() * result.num_targets
            sums["masked_ce"] += _masked_ce(logits.diff, batch.response_ids, noise.masked & batch.target_mask)
            targets, masked = targets + result.num_targets, masked + result.num_masked
        out = {"l_ar": sums["l_ar"] / targets, "l_diff": sums["l_diff"] / targets,
               "masked_ce": sums["masked_ce"] / max(masked, 1)}
        out["loss"] = out["l_ar"] + alpha * out["l_diff"]
        return out

    return evaluate


def _masked_ce(logits: torch.Tensor, targets: torch.Tensor, where: torch.Tensor) -> float:
    """Summed plain CE at masked positions (no 1/t weight): how well block mode fills masks."""
    ce = torch.nn.functional.cross_entropy(logits[where].float(), targets[where], reduction="sum")
    return ce.item()


def task_evaluator(tokenizer, examples: Sequence, tasks: Sequence, block_size: int,
                   max_new_tokens: int = 256, batch_size: int = 8,
                   enable_thinking: bool = False, generate_kwargs: dict | None = None) -> EvalFn:
    """Task accuracy with the model's block-diffusion `generate` (greedy, HF convention: returns
    prompt + new tokens), scored by each task's own scorer. `generate_kwargs` (e.g. the recipe's
    generation controls) go to every `generate` call."""
    by_name = {task.name: task for task in tasks}
    pairs = encode_examples(tokenizer, examples, enable_thinking)

    def evaluate(model, step: int) -> dict[str, float]:
        correct: dict[str, list[bool]] = {}
        for start in range(0, len(pairs), batch_size):
            chunk = pairs[start:start + batch_size]
            kwargs = dict(generate_kwargs or {}, block_size=block_size, max_new_tokens=max_new_tokens)
            texts = _generate(model, tokenizer, [p.prompt_ids for p in chunk], kwargs)
            for example, text in zip(examples[start:start + batch_size], texts):
                score = by_name[example.task].score(example, text)
                correct.setdefault(example.task, []).append(bool(score["correct"]))
        out = {f"acc/{name}": sum(v) / len(v) for name, v in correct.items()}
        out["acc/mean"] = sum(out.values()) / len(out)
        return out

    return evaluate


def _generate(model, tokenizer, prompts, kwargs: dict) -> list[str]:
    width = max(map(len, prompts))
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    device = next(model.parameters()).device
    out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                         **{"do_sample": False, **kwargs})
    sequences = getattr(out, "sequences", out)
    return tokenizer.batch_decode(sequences[:, width:].tolist(), skip_special_tokens=False)


def combine(*evaluators: EvalFn | None) -> EvalFn:
    """One callback that runs each given evaluator and merges their metrics."""
    active = [e for e in evaluators if e is not None]

    def evaluate(model, step: int) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for e in active:
            metrics.update(e(model, step))
        return metrics

    return evaluate
