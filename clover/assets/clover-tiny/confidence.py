"""Token choice and its confidence (SPEC §4).

Confidence is the probability of the chosen token under the T = 1 softmax of the processed logits
(controls and mask exclusion applied; temperature, top-k and top-p not), so sampling settings never
change what counts as confident.
"""

import torch


def filter_top_k(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep the `top_k` largest logits of each row (0 = off); others become -inf."""
    if top_k <= 0 or top_k >= logits.shape[-1]:
        return logits
    kth = logits.topk(top_k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def filter_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches `top_p` (always >= 1 token)."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    mass_before = probs.cumsum(-1) - probs  # mass of the strictly more likely tokens
    drop_sorted = mass_before >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def sample(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
           generator: torch.Generator | None) -> torch.Tensor:
    """Draw one token per row of logits [..., V] from the tempered, filtered distribution."""
    filtered = filter_top_p(filter_top_k(logits / temperature, top_k), top_p)
    probs = filtered.softmax(-1).reshape(-1, logits.shape[-1])
    return torch.multinomial(probs, 1, generator=generator).view(logits.shape[:-1])


def predict_with_confidence(logits: torch.Tensor, do_sample: bool = False, temperature: float = 1.0,
                            top_k: int = 0, top_p: float = 1.0,
                            generator: torch.Generator | None = None):
    """logits [..., V] (processed) -> (tokens [...] long, confidence [...] float32)."""
    logits = logits.float()
    probs = logits.softmax(-1)
    if do_sample:
        tokens = sample(logits, temperature, top_k, top_p, generator)
    else:
        tokens = logits.argmax(-1)
    return tokens, probs.gather(-1, tokens[..., None]).squeeze(-1)
