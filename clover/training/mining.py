"""Hard-example mining: the training examples the starting model finds least likely.

The embedded model's wrong answers are lookups it settles the wrong way at about 0.65 against
0.35 (BENCHMARKS, "Weight averages"), while its mean loss over a training mix is about 0.01 nats a
token: nearly every example is already right, so most of a batch teaches little. Mining draws a
pool of fresh training examples, scores each by the model's teacher-forced causal loss on its
whole answer (the summed CE, -log p(answer | prompt)), and keeps the hardest share of each task,
so the mix keeps its task proportions and only the examples within a task change.

    pool   = training_examples(pool_size, seed, tasks)      # fresh: a seed the run does not use
    loss_i = sum_j CE(causal logits_i,j , response_i,j)     # one no-grad forward per batch
    keep   = the `share` of each task's pool with the largest loss_i
"""

import time
from collections.abc import Callable, Sequence

import torch

from .data import BatchSpec, Pair
from .loss import causal_logits, token_ce
from .sources import task_train_examples, weighted_tasks


@torch.no_grad()
def answer_losses(model, pairs: Sequence[Pair], spec: BatchSpec, batch_size: int = 32,
                  progress: Callable[[int, int], None] | None = None) -> list[float]:
    """-log p(response | prompt) of each pair under the causal mode, teacher-forced (nats,
    summed over the response and its EOS). Pairs are scored in batches of similar length;
    `progress(done, total)` is called after each batch."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    order = sorted(range(len(pairs)), key=lambda i: (len(pairs[i].prompt_ids), len(pairs[i].response_ids)))
    losses = [0.0] * len(pairs)
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        batch = spec.collate([pairs[i] for i in rows]).to(device)
        ce = token_ce(causal_logits(model, batch), batch.response_ids)  # [N, R]
        # a response's block padding is a target, but only its first EOS says anything
        first_eos = _through_first_eos(batch.response_ids, batch.target_mask, (spec.eos_id, *spec.eos_ids))
        for row, total in zip(rows, (ce * first_eos).sum(dim=1).tolist()):
            losses[row] = total
        if progress is not None:
            progress(min(start + batch_size, len(order)), len(order))
    model.train(was_training)
    return losses


def _through_first_eos(response: torch.Tensor, target_mask: torch.Tensor, eos_ids) -> torch.Tensor:
    """[N, R] float: 1 on each row's targets up to and including its first end-of-response token."""
    is_eos = torch.isin(response, torch.tensor(eos_ids, device=response.device)) & target_mask
    before = is_eos.long().cumsum(dim=1) - is_eos.long()  # EOS tokens strictly before each position
    return (target_mask & (before == 0)).float()


def hardest_per_group(losses: Sequence[float], groups: Sequence[str], share: float) -> list[int]:
    """Indices of the `share` of each group's items with the largest loss (at least one per
    group), in their original order. Ties keep the earlier item."""
    if not 0.0 < share <= 1.0:
        raise ValueError(f"share={share} must be in (0, 1]")
    if len(losses) != len(groups):
        raise ValueError(f"{len(losses)} losses for {len(groups)} group labels")
    keep = []
    for name in dict.fromkeys(groups):
        members = [i for i, g in enumerate(groups) if g == name]
        ranked = sorted(members, key=lambda i: (-losses[i], i))
        keep += ranked[:max(1, round(share * len(members)))]
    return sorted(keep)


def draw_pool(data, tokenizer, tasks, size: int, seed: int) -> tuple[list[str], list[Pair]]:
    """(group labels, pairs) of `size` fresh training examples drawn with `seed` as the recipe's
    `data` draws its own (task weights, thinking share); a group is a task and turn, thinking or
    direct (an answer without its derivation is harder)."""
    examples, modes, pairs = task_train_examples(tokenizer, weighted_tasks(tasks, data.task_weights), size,
                                                 seed, data.enable_thinking, data.thinking_fraction)
    groups = [f"{e.task} ({'thinking' if mode else 'direct'})" for e, mode in zip(examples, modes)]
    return groups, pairs


def mine_hard_pairs(data, tokenizer, tasks, spec: BatchSpec, model, fits=lambda pair: True,
                    log=print) -> list[Pair]:
    """The hardest `data.mine_share` of each group of the `data.mine_pool` fresh examples (seed
    `data.mine_seed`, `draw_pool`), scored by `model` as it starts; `data` is the recipe's
    `DataRecipe`, `fits` drops pairs the run would drop (too long)."""
    groups, pairs = draw_pool(data, tokenizer, tasks, data.mine_pool, data.mine_seed)
    fitting = [i for i, p in enumerate(pairs) if fits(p)]
    groups, pairs = [groups[i] for i in fitting], [pairs[i] for i in fitting]
    start, batch_size, every = time.perf_counter(), 32, max(1, len(pairs) // 10)

    def progress(done, total):
        if done // every != (done - batch_size) // every or done == total:
            log(f"mining: scored {done}/{total} examples ({time.perf_counter() - start:.0f} s)")

    losses = answer_losses(model, pairs, spec, batch_size, progress)
    keep = hardest_per_group(losses, groups, data.mine_share)
    for name in dict.fromkeys(groups):
        pool = [losses[i] for i, g in enumerate(groups) if g == name]
        hard = sorted(losses[i] for i in keep if groups[i] == name)
        log(f"mining: {name}: kept {len(hard)} of {len(pool)}, answer loss >= {hard[0]:.3f} nats "
            f"(pool mean {sum(pool) / len(pool):.3f}, kept mean {sum(hard) / len(hard):.3f})")
    return [pairs[i] for i in keep]
