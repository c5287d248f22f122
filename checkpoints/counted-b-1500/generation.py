"""`generate()` for block-diffusion decoding (SPEC §4): a thin consumer of `stream_generate`.

    out = model.generate(**tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left"),
                         max_new_tokens=256, block_size=32, threshold=0.95, do_sample=False)

Returns prompt + generated tokens (first EOS included, nothing after), rows right-padded with the
pad id; with `return_dict_in_generate=True`, a `GenerateOutput` with `sequences`,
`num_forward_passes` and per-row statistics. Settings: keyword > the checkpoint's
`generation_config.json` > SPEC §2 defaults (see `generation_config.py`). transformers' own keywords
(`max_length`, `stop_strings`, `num_return_sequences`, `logits_processor`, ...) and right-padded
batches: see `take_conventions` below.

`stream_generate`: the one decoding entry point. It resolves and checks the request, then returns
the step generator of the chosen mode; `generate` consumes the same iterator.

Events, in order: `StepEvent` (per forward that fills positions), `BlockEvent` (per row, when a
block of its response is final), and one closing `DoneEvent` carrying the `GenerateOutput`.

transformers' `generate` keywords on block diffusion: what each means here, or why it is refused.

Supported (as in transformers):
- `max_length` / `min_length`: totals, so prompt width is subtracted (`max_new_tokens`, when also
  given, wins); `min_new_tokens`: EOS cannot be chosen before that response position.
- `num_return_sequences=n`: every prompt row is repeated n times (rows `i*n .. i*n+n-1`) and the
  copies are sampled independently; greedy decoding with n > 1 is refused as transformers does.
- `stop_strings` with `tokenizer=`: a row ends after the token that completes a stop string (the
  string is kept, as in transformers); decoding stops early once every row has ended.
- `logits_processor`: transformers `LogitsProcessor`s `(input_ids [R, T], scores [R, V])`, applied
  after the built-in controls. Block diffusion scores all slots of a block at once, so each slot
  sees `input_ids` = its row's prompt + committed response (the block's own tokens are not decided
  in order yet and are not included).
- right-padded batches: rows padded on the right are moved to the left; the returned sequences are
  in that left-padded layout (so `out[:, input_ids.shape[1]:]` is still the response).
- `use_cache=True`, `num_beams=1` and `output_*=False` are accepted as the no-ops they are here.

Refused, with the reason, in `REFUSALS`.
"""

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from .generation_autoregressive import autoregressive_steps, self_speculative_steps
from .generation_batch import BlockEvent, DoneEvent, GenerateOutput, RowStats, StepEvent
from .generation_block_diffusion import block_diffusion_steps
from .generation_config import FIELDS, DecodeConfig, resolve_config, validate_prompt, validate_settings
from .generation_sampling import make_logits_processors

@dataclass
class Request:
    cfg: DecodeConfig
    input_ids: torch.Tensor  # [N, T] on the model's device, left-padded
    attention_mask: torch.Tensor  # [N, T]
    logits_processors: list = field(default_factory=list)  # after the controls: `(logits, ctx) -> logits`
    constraints: list | None = None  # a grammar constraint (or None) per row (`generation_sampling.commit_run`)


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


BEAMS = ("beam search keeps per-token beams; block diffusion commits several tokens per forward in "
         "confidence order, so there are no per-token hypotheses to rank")
NO_SCORES = ("block diffusion fills a block over several forwards in confidence order, so there is no "
             "per-step score of each generated token (a committed token's logprob: the server's "
             "`logprobs`)")
NO_RECORD = "not recorded while decoding; run the model's forward on the returned sequences"

# keyword -> (refused when the value is this, reason)
REFUSALS = {
    "use_cache": (lambda v: v is False, "block diffusion decodes against its cache (the committed "
                  "prefix is never recomputed); use_cache=False is not implemented"),
    "num_beams": (lambda v: v is not None and v > 1, BEAMS),
    "num_beam_groups": (lambda v: v is not None and v > 1, BEAMS),
    "constraints": (bool, BEAMS),
    "force_words_ids": (bool, BEAMS),
    "output_scores": (bool, NO_SCORES),
    "output_logits": (bool, NO_SCORES),
    "output_attentions": (bool, NO_RECORD),
    "output_hidden_states": (bool, NO_RECORD),
    "stopping_criteria": (bool, "transformers StoppingCriteria are called after every single token; "
                          "block diffusion commits whole blocks: use stop_strings= (with tokenizer=), "
                          "eos_token_id= or max_new_tokens="),
    "assistant_model": (lambda v: v is not None, "block diffusion already drafts a whole block per "
                        "forward; speculative decoding with an assistant model is not implemented"),
    "prompt_lookup_num_tokens": (lambda v: v is not None, "block diffusion already drafts a whole "
                                 "block per forward; prompt-lookup decoding is not implemented"),
}


@dataclass
class Conventions:
    """The transformers keywords of one `generate` call, taken out of its settings."""

    num_return_sequences: int = 1
    stop_strings: tuple[str, ...] = ()
    tokenizer: object = None
    logits_processor: list = field(default_factory=list)


def take_conventions(kwargs: dict, prompt_width: int) -> Conventions:
    """Pop the transformers keywords from `kwargs` (translating `max_length`/`min_length` into
    `max_new_tokens`/`min_new_tokens` there) and refuse the unsupported ones."""
    for name, (refused, reason) in REFUSALS.items():
        value = kwargs.pop(name, None)
        if refused(value):
            raise ValueError(f"{name}={value!r} is not supported: {reason}")
    max_length, min_length = kwargs.pop("max_length", None), kwargs.pop("min_length", None)
    if max_length is not None and kwargs.get("max_new_tokens") is None:
        if max_length <= prompt_width:
            raise ValueError(f"max_length={max_length} leaves no room to generate after the prompt "
                             f"width {prompt_width}; use max_new_tokens")
        kwargs["max_new_tokens"] = max_length - prompt_width
    if min_length is not None and kwargs.get("min_new_tokens") is None:
        kwargs["min_new_tokens"] = max(0, min_length - prompt_width)
    n = kwargs.pop("num_return_sequences", None) or 1
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"num_return_sequences={n!r} must be a positive integer")
    stops = kwargs.pop("stop_strings", None) or ()
    stops = (stops,) if isinstance(stops, str) else tuple(stops)
    tokenizer = kwargs.pop("tokenizer", None)
    if stops and tokenizer is None:
        raise ValueError("stop_strings needs tokenizer= (the text of the generated tokens is matched)")
    if any(not isinstance(s, str) or not s for s in stops):
        raise ValueError(f"stop_strings={list(stops)!r} must be non-empty strings")
    processors = kwargs.pop("logits_processor", None) or []
    return Conventions(n, stops, tokenizer, list(processors))


def to_left_padding(input_ids: torch.Tensor, attention_mask: torch.Tensor):
    """Rows padded on the right (1s then 0s) rotated to the left (0s then 1s); other rows as they are
    (left padding passes; a row with holes is refused later by `validate_prompt`)."""
    real = attention_mask.bool()
    rises = (~real[:, :-1] & real[:, 1:]).any(-1)  # [N] a 0 -> 1 step: left padding or a hole
    falls = (real[:, :-1] & ~real[:, 1:]).any(-1)  # [N] a 1 -> 0 step: right padding or a hole
    right = falls & ~rises
    if not right.any():
        return input_ids, attention_mask
    width = input_ids.shape[1]
    shift = (~real).sum(-1) * right  # [N] trailing pads of each right-padded row
    index = (torch.arange(width, device=input_ids.device)[None] - shift[:, None]) % width  # [N, T]
    return input_ids.gather(1, index), attention_mask.gather(1, index)


class HistoryLogitsProcessor:
    """transformers `LogitsProcessor`s as one Clover control `(logits [A, L, V], ctx) -> logits`.
    `histories[row]` (1-D, prompt + committed response) is kept current by the caller."""

    def __init__(self, processors: list, histories: list[torch.Tensor]):
        self.processors, self.histories = processors, histories

    def __call__(self, logits: torch.Tensor, ctx) -> torch.Tensor:
        rows = []
        for i, row in enumerate(ctx.rows):
            ids = self.histories[row].to(logits.device)[None].expand(logits.shape[1], -1)  # [L, T]
            scores = logits[i]  # [L, V]
            for processor in self.processors:
                scores = processor(ids, scores)
            rows.append(scores)
        return torch.stack(rows)


class StopStrings:
    """Per row: the response so far, and where it ends when its text first contains a stop string
    (right after the token that completes it)."""

    def __init__(self, stop_strings: tuple[str, ...], tokenizer, num_rows: int):
        self.stop_strings, self.tokenizer = stop_strings, tokenizer
        self.responses: list[list[int]] = [[] for _ in range(num_rows)]
        self.cut: list[int | None] = [None] * num_rows

    def _stops(self, tokens: list[int]) -> bool:
        text = self.tokenizer.decode(tokens)
        return any(s in text for s in self.stop_strings)

    def add(self, row: int, tokens: list[int]) -> bool:
        """Record committed tokens; True when this row has now met a stop string."""
        if self.cut[row] is not None:
            return True
        before = len(self.responses[row])
        self.responses[row] += tokens
        if not self._stops(self.responses[row]):
            return False
        self.cut[row] = next(k for k in range(before + 1, len(self.responses[row]) + 1)
                             if self._stops(self.responses[row][:k]))
        return True


IGNORED_INPUTS = ("token_type_ids",)  # tokenizers may return these; the model has no use for them


class BlockDiffusionGenerationMixin:
    """Adds `generate` and `stream_generate` to `CloverMoeForCausalLM`."""

    def stream_generate(self, input_ids, attention_mask=None, **kwargs):
        """Iterator of `StepEvent` / `BlockEvent`, closed by a `DoneEvent` (see `stream_generate`)."""
        for name in IGNORED_INPUTS:
            kwargs.pop(name, None)
        return stream_generate(self, input_ids, attention_mask, **kwargs)

    def generate(self, input_ids=None, attention_mask=None, return_dict_in_generate: bool = False,
                 streamer=None, **kwargs):
        """Decode with block diffusion (or `mode="ar"`). `streamer`: an object with `put(ids)` and
        `end()` (e.g. transformers' `TextStreamer`), batch of one only; it receives the prompt, then
        each committed block's tokens."""
        if input_ids is None:
            raise ValueError("generate() needs input_ids")
        input_ids = torch.as_tensor(input_ids)
        input_ids = input_ids[None] if input_ids.dim() == 1 else input_ids
        mask = torch.ones_like(input_ids) if attention_mask is None else torch.as_tensor(attention_mask)
        mask = mask[None] if mask.dim() == 1 else mask
        if mask.shape == input_ids.shape and input_ids.numel():
            input_ids, mask = to_left_padding(input_ids, mask)
        conventions = take_conventions(kwargs, input_ids.shape[-1])
        cfg = self._settings(kwargs)
        n = conventions.num_return_sequences
        if n > 1:
            if not cfg.do_sample:
                raise ValueError(f"num_return_sequences={n} needs sampling (do_sample=True): greedy "
                                 "decoding would return the same sequence n times")
            input_ids, mask = input_ids.repeat_interleave(n, 0), mask.repeat_interleave(n, 0)
        if streamer is not None and input_ids.shape[0] != 1:
            raise ValueError("a streamer supports a batch of one prompt only")
        histories = [ids[m.bool()].cpu() for ids, m in zip(input_ids, mask)]
        if conventions.logits_processor:
            kwargs["logits_processor"] = [HistoryLogitsProcessor(conventions.logits_processor, histories)]
        stops = None
        if conventions.stop_strings:
            stops = StopStrings(conventions.stop_strings, conventions.tokenizer, input_ids.shape[0])
        if streamer is not None:
            streamer.put(input_ids.cpu())
        events = self.stream_generate(input_ids, mask, **kwargs)
        output = consume(self, events, histories, stops, streamer, input_ids, cfg)
        if streamer is not None:
            streamer.end()
        if stops is not None:
            output = cut_at_stops(output, stops, input_ids.shape[1], cfg.pad_id)
        return output if return_dict_in_generate else output.sequences

    def _settings(self, kwargs: dict):
        known = {k: v for k, v in kwargs.items() if k in FIELDS}
        return resolve_config(kwargs.get("generation_config") or getattr(self, "generation_config", None),
                              self.config, known)


def consume(model, events, histories, stops, streamer, input_ids, cfg) -> GenerateOutput:
    """Run the decoder to its `DoneEvent`, or, once every row has ended or met a stop string, close
    it early and assemble the output here (forwards counted by a hook on the model)."""
    forwards = [0]
    hook = model.register_forward_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
    first_step_at = None
    rows = [RowStats() for _ in range(input_ids.shape[0])]
    try:
        for event in events:
            if isinstance(event, StepEvent) and first_step_at is None:
                first_step_at = forwards[0]
            elif isinstance(event, BlockEvent):
                tokens = event.token_ids.cpu()
                histories[event.row] = torch.cat((histories[event.row], tokens))
                rows[event.row].new_tokens += len(tokens)
                rows[event.row].num_forwards = forwards[0]
                if event.finished:
                    ended_by_eos = len(tokens) > 0 and int(tokens[-1]) in cfg.eos_token_id
                    rows[event.row].stop_reason = "eos" if ended_by_eos else "length"
                if streamer is not None:
                    streamer.put(tokens)
                if stops is not None:
                    stops.add(event.row, tokens.tolist())
                    if all(r.stop_reason or stops.cut[i] is not None for i, r in enumerate(rows)):
                        events.close()
                        return early_output(input_ids, stops, rows, forwards[0], first_step_at, cfg.pad_id)
            elif isinstance(event, DoneEvent):
                return event.output
    finally:
        hook.remove()
    raise RuntimeError("the decoder ended without a DoneEvent")


def early_output(input_ids, stops: StopStrings, rows: list[RowStats], num_forwards: int, first_step_at,
                 pad_id: int) -> GenerateOutput:
    """The output of a run closed early: responses as recorded (`cut_at_stops` cuts them and sets
    "stop"); rows that ended by EOS or length before keep "eos" / "length"."""
    width = max(len(r) for r in stops.responses)
    response = torch.full((input_ids.shape[0], width), pad_id, dtype=torch.long)
    for i, tokens in enumerate(stops.responses):
        response[i, :len(tokens)] = torch.tensor(tokens, dtype=torch.long)
    sequences = torch.cat((input_ids, response.to(input_ids.device)), dim=1)
    return GenerateOutput(sequences, num_forwards, max(0, (first_step_at or 1) - 1), rows)


def cut_at_stops(output: GenerateOutput, stops: StopStrings, prompt_width: int, pad_id: int) -> GenerateOutput:
    """Rows that met a stop string end right after it (pad after), with stop reason "stop"."""
    sequences = output.sequences.clone()
    for row, cut in enumerate(stops.cut):
        if cut is None:
            continue
        sequences[row, prompt_width + cut:] = pad_id
        output.rows[row].new_tokens = cut
        output.rows[row].stop_reason = "stop"
    width = prompt_width + max(r.new_tokens for r in output.rows)
    return GenerateOutput(sequences[:, :width], output.num_forward_passes, output.num_prefill_forwards,
                          output.rows)
