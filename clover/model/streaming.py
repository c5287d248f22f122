"""`stream_generate`: the one decoding entry point. It resolves and checks the request, then returns
the step generator of the chosen mode; `generate` consumes the same iterator.

Events, in order: `StepEvent` (per forward that fills positions), `BlockEvent` (per row, when a
block of its response is final), and one closing `DoneEvent` carrying the `GenerateOutput`.
"""

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from .autoregressive import autoregressive_steps
from .block_diffusion import block_diffusion_steps
from .controls import make_logits_processors
from .self_speculative import self_speculative_steps
from .generation_config import DecodeConfig, resolve_config, validate_prompt, validate_settings


@dataclass
class Request:
    cfg: DecodeConfig
    input_ids: torch.Tensor  # [N, T] on the model's device, left-padded
    attention_mask: torch.Tensor  # [N, T]
    logits_processors: list = field(default_factory=list)  # after the controls: `(logits, ctx) -> logits`


def prepare_request(model, input_ids, attention_mask=None, generation_config=None, **kwargs) -> Request:
    """Resolve settings (keyword > checkpoint > SPEC) and refuse bad requests before any compute."""
    if generation_config is None:
        generation_config = getattr(model, "generation_config", None)
    cfg = resolve_config(generation_config, model.config, kwargs)
    validate_settings(cfg, model.config.vocab_size)
    input_ids = torch.as_tensor(input_ids)
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    attention_mask = torch.as_tensor(attention_mask)
    if attention_mask.dim() == 1:
        attention_mask = attention_mask[None]
    validate_prompt(input_ids, attention_mask, cfg, model.config)
    device = next(model.parameters()).device
    return Request(cfg, input_ids.to(device).long(), attention_mask.to(device).long())


def make_generator(model, seed: int | None, generator: torch.Generator | None):
    if generator is not None:
        return generator
    if seed is None:
        return None
    device = next(model.parameters()).device
    return torch.Generator(device=device).manual_seed(int(seed))


def stream_generate(model, input_ids, attention_mask=None, *, seed: int | None = None,
                    generator: torch.Generator | None = None, generation_config=None,
                    logits_processor: list | None = None, **kwargs) -> Iterator:
    """Decode `input_ids` [N, T] (left-padded; `attention_mask` 0 on padding) and yield events.
    Keyword settings are the `DecodeConfig` fields (`mode="ar"` for autoregressive
    decoding, `mode="self_spec"` for self-speculative decoding).
    Sampling uses `generator` (on the model's device), else a fresh one seeded with `seed`.
    `logits_processor`: callables `(logits [N, L, V], ctx: ControlContext) -> logits` applied after
    the built-in controls."""
    request = prepare_request(model, input_ids, attention_mask, generation_config, **kwargs)
    request.logits_processors = list(logits_processor or [])
    return run_decoder(model, request, make_generator(model, seed, generator))


@torch.no_grad()
def run_decoder(model, request: Request, generator) -> Iterator:
    cfg = request.cfg
    steps = {"ar": autoregressive_steps, "self_spec": self_speculative_steps}.get(cfg.mode, block_diffusion_steps)
    processors = make_logits_processors(cfg) + request.logits_processors
    yield from steps(model, request.input_ids, request.attention_mask, cfg, processors, generator)
