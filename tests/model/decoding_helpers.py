"""Shared helpers for the decoding tests."""

import pytest
import torch

from tiny import tiny_model

EOS = 5
THINK_START, THINK_END = 3, 4
CONTROLS_OFF = dict(repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0,
                    dllm_length_penalty=0.0, dllm_think_end_bias=0.0)
CONTROLS_ON = dict(repetition_penalty=1.3, presence_penalty=0.7, frequency_penalty=0.4,
                   dllm_length_penalty=3.0, dllm_length_penalty_start=4, dllm_length_penalty_window=12,
                   dllm_think_end_bias=6.0, dllm_think_end_start=2, dllm_think_end_window=6,
                   think_start_token_id=THINK_START, think_end_token_id=THINK_END)


def peaked_model(seed: int = 0, head_scale: float = 20.0, **overrides):
    """A random tiny model whose scaled head gives peaked distributions (several fills per step)."""
    model = tiny_model(seed=seed, **overrides)
    with torch.no_grad():
        model.lm_head.weight.mul_(head_scale)
    return model


def prompt(length: int, seed: int = 0, think: bool = False) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(8, 120, (length,), generator=g).tolist()
    return ids + [THINK_START] if think else ids


def greedy_settings(block_size: int = 8, **extra) -> dict:
    """Greedy decoding of 40 tokens with every control on (the causal-fallback and fill-rule tests)."""
    return dict(max_new_tokens=40, do_sample=False, block_size=block_size, eos_token_id=[EOS], **CONTROLS_ON,
                **extra)


def hand_fallback_fill(block: torch.Tensor, step, choices: list[int], vocab: int = 100):
    """`generation_causal_fallback.fallback_fill` of a hand-made 1-row `step` whose causal mode
    chooses `choices[j]` at position j (greedy, no controls, mask id `vocab - 1`)."""
    from types import SimpleNamespace

    from clover.model.generation_causal_fallback import fallback_fill

    batch = SimpleNamespace(counts=torch.zeros(1, vocab), think_open=None, rows=[0])
    cfg = SimpleNamespace(do_sample=False, temperature=1.0, top_k=0, top_p=1.0)
    wanted = torch.nn.functional.one_hot(torch.tensor([choices]), vocab).float() * 10  # [1, B, V]: a_j
    causal = torch.cat((wanted[:, 1:], wanted[:, :1]), dim=1)  # logit j predicts j + 1 (the last: none)
    return fallback_fill(causal, wanted[:, 0], step, batch, 0, block.shape[1], cfg, [], vocab - 1)


def left_pad(prompts: list[list[int]], pad: int = 0):
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def response(out, prompt_width: int, row: int = 0, length: int | None = None) -> list[int]:
    seq = out.sequences if hasattr(out, "sequences") else out
    tokens = seq[row, prompt_width:].tolist()
    return tokens if length is None else tokens[:length]


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest (and steadiest on a shared CPU) on one thread. Test modules import
    this fixture, which makes it autouse for them."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
