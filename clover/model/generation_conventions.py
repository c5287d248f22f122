"""transformers' `generate` keywords on block diffusion: what each means here, or why it is refused.

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

from dataclasses import dataclass, field

import torch

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
