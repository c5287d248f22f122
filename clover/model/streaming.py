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
    constraints: list | None = None  # a grammar constraint (or None) per row (`generation_constraint.py`)


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
                    logits_processor: list | None = None, grammar_constraints: list | None = None,
                    **kwargs) -> Iterator:
    """Decode `input_ids` [N, T] (left-padded; `attention_mask` 0 on padding) and yield events.
    Keyword settings are the `DecodeConfig` fields (`mode="ar"` for autoregressive
    decoding, `mode="self_spec"` for self-speculative decoding).
    Sampling uses `generator` (on the model's device), else a fresh one seeded with `seed`.
    `logits_processor`: callables `(logits [N, L, V], ctx: ControlContext) -> logits` applied after
    the built-in controls. `grammar_constraints`: one grammar constraint (or None) per row, e.g.
    `clover.structured.json_schema_grammar(tokenizer, schema).constraint()` (block diffusion and AR)."""
    request = prepare_request(model, input_ids, attention_mask, generation_config, **kwargs)
    request.logits_processors = list(logits_processor or [])
    request.constraints = check_constraints(grammar_constraints, request)
    return run_decoder(model, request, make_generator(model, seed, generator))


def check_constraints(constraints: list | None, request: Request) -> list | None:
    """None when no row is constrained; else the list, one entry per row, for a mode that has them."""
    if constraints is None or all(c is None for c in constraints):
        return None
    rows = request.input_ids.shape[0]
    if len(constraints) != rows:
        raise ValueError(f"grammar_constraints has {len(constraints)} entries for {rows} prompt rows "
                         "(one per row)")
    if request.cfg.mode == "self_spec":
        raise ValueError("grammar_constraints are not supported with mode='self_spec' "
                         "(use 'block_diffusion' or 'ar')")
    return list(constraints)


@torch.no_grad()
def run_decoder(model, request: Request, generator) -> Iterator:
    cfg = request.cfg
    processors = make_logits_processors(cfg) + request.logits_processors
    args = (model, request.input_ids, request.attention_mask, cfg, processors, generator)
    if cfg.mode == "self_spec":
        yield from self_speculative_steps(*args)
    elif cfg.mode == "ar":
        yield from autoregressive_steps(*args, request.constraints)
    else:
        yield from block_diffusion_steps(*args, request.constraints)
