"""`generate()` for block-diffusion decoding (SPEC §4): a thin consumer of `stream_generate`.

    out = model.generate(**tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left"),
                         max_new_tokens=256, block_size=32, threshold=0.95, do_sample=False)

Returns prompt + generated tokens (first EOS included, nothing after), rows right-padded with the
pad id; with `return_dict_in_generate=True`, a `GenerateOutput` with `sequences`,
`num_forward_passes` and per-row statistics. Settings: keyword > the checkpoint's
`generation_config.json` > SPEC §2 defaults (see `generation_config.py`).
"""

import torch

from .events import BlockEvent, DoneEvent, GenerateOutput
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
        events = self.stream_generate(input_ids, attention_mask, **kwargs)
        if streamer is not None and events_batch_size(input_ids) != 1:
            raise ValueError("a streamer supports a batch of one prompt only")
        if streamer is not None:
            streamer.put(input_ids.cpu())
        output: GenerateOutput | None = None
        for event in events:
            if isinstance(event, BlockEvent) and streamer is not None:
                streamer.put(event.token_ids.cpu())
            elif isinstance(event, DoneEvent):
                output = event.output
        if streamer is not None:
            streamer.end()
        return output if return_dict_in_generate else output.sequences


def events_batch_size(input_ids) -> int:
    return 1 if input_ids.dim() == 1 else input_ids.shape[0]
