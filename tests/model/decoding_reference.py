"""Independent reference decoders for the tests: no cache (the whole sequence is recomputed at every
step), one prompt at a time, controls written out per position with plain Python loops."""

from collections import Counter

import torch


def ramp(n, start, window):
    if window <= 0:
        return float(n >= start)
    return min(max((n - start) / window, 0.0), 1.0)


def thinking_open(context, think_start, think_end):
    last_start = max((i for i, t in enumerate(context) if t == think_start), default=-1)
    last_end = max((i for i, t in enumerate(context) if t == think_end), default=-1)
    return last_start > last_end


def controlled(logits, history, n, context, s):
    """Apply SPEC §6 to one slot's logits [V] (a copy), in SPEC order."""
    logits = logits.clone()
    r = s.get("repetition_penalty", 1.0)
    for tok in set(history):
        logits[tok] = logits[tok] / r if logits[tok] > 0 else logits[tok] * r
    f, p = s.get("frequency_penalty", 0.0), s.get("presence_penalty", 0.0)
    for tok, count in Counter(history).items():
        logits[tok] -= f * count + p
    eos = s.get("eos_token_id", [])
    for e in set(eos):
        logits[e] += s.get("dllm_length_penalty", 0.0) * ramp(
            n, s.get("dllm_length_penalty_start", 0), s.get("dllm_length_penalty_window", 1))
    think = s.get("think_start_token_id"), s.get("think_end_token_id")
    if None not in think and thinking_open(context, *think):
        logits[think[1]] += s.get("dllm_think_end_bias", 0.0) * ramp(
            n, s.get("dllm_think_end_start", 0), s.get("dllm_think_end_window", 1))
    return logits


@torch.no_grad()
def naive_block_diffusion(model, prompt, s):
    """Greedy low-confidence block diffusion for one prompt (list of ids). `s`: settings dict."""
    mask, size, limit_total = model.config.mask_token_id, s["block_size"], s["max_new_tokens"]
    eos = set(s.get("eos_token_id", []))
    response = []
    while len(response) < limit_total:
        limit = min(size, limit_total - len(response))
        block = [mask] * size
        while True:
            seq = torch.tensor([prompt + response + block])
            logits = model(seq, block_len=size).logits[0, -size:]
            history = response + [t for t in block if t != mask]
            choice = {}
            for j in range(limit):
                if block[j] != mask:
                    continue
                slot = logits[j].clone()
                slot[mask] = float("-inf")
                context = prompt + response + [t for t in block[:j] if t != mask]
                slot = controlled(slot, history, len(response) + j, context, s)
                tok = int(slot.argmax())
                choice[j] = (tok, float(slot.softmax(-1)[tok]))
            fill = [j for j, (_, c) in choice.items() if c > s["threshold"]]
            if not fill:
                fill = [max(choice, key=lambda j: (choice[j][1], -j))]
            for j in fill:
                block[j] = choice[j][0]
            first_mask = next((j for j in range(limit) if block[j] == mask), limit)
            eos_at = next((j for j in range(first_mask) if block[j] in eos), None)
            if eos_at is not None:
                return response + block[:eos_at + 1]
            if first_mask >= limit:
                response += block[:limit]
                break
    return response


@torch.no_grad()
def naive_autoregressive(model, prompt, s):
    mask, eos = model.config.mask_token_id, set(s.get("eos_token_id", []))
    response = []
    while len(response) < s["max_new_tokens"]:
        logits = model(torch.tensor([prompt + response])).logits[0, -1].clone()
        logits[mask] = float("-inf")
        logits = controlled(logits, response, len(response), prompt + response, s)
        response.append(int(logits.argmax()))
        if response[-1] in eos:
            break
    return response
