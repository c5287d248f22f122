"""`generate()` for block-diffusion decoding (SPEC §4): a thin consumer of `stream_generate`.

    out = model.generate(**tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left"),
                         max_new_tokens=256, block_size=32, threshold=0.95, do_sample=False)

Returns prompt + generated tokens (first EOS included, nothing after), rows right-padded with the
pad id; with `return_dict_in_generate=True`, a `GenerateOutput` with `sequences`,
`num_forward_passes` and per-row statistics. Settings: keyword > the checkpoint's
`generation_config.json` > SPEC §2 defaults (see `generation_config.py`). transformers' own keywords
(`max_length`, `stop_strings`, `num_return_sequences`, `logits_processor`, ...) and right-padded
batches: see `generation_conventions.py`.
"""

import torch

from .events import BlockEvent, DoneEvent, GenerateOutput, RowStats, StepEvent
from .generation_config import FIELDS, resolve_config
from .generation_conventions import HistoryLogitsProcessor, StopStrings, take_conventions, to_left_padding
from .streaming import stream_generate

IGNORED_INPUTS = ("token_type_ids",)  # tokenizers may return these; the model has no use for them


class BlockDiffusionGenerationMixin:
    """Adds `generate` and `stream_generate` to `CloverMoeForCausalLM`."""

    def stream_generate(self, input_ids, attention_mask=None, **kwargs):
        """Iterator of `StepEvent` / `BlockEvent`, closed by a `DoneEvent` (see `streaming.py`)."""
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
