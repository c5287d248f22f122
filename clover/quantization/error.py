"""Per-layer relative output error of a quantized model against its float original."""

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LayerError:
    name: str  # "layers.3" (decoder layer output) or "logits"
    relative: float  # ||y_q - y_f|| / ||y_f||


def layer_outputs(model, input_ids: torch.Tensor, **kwargs) -> tuple[list[torch.Tensor], torch.Tensor]:
    """(each decoder layer's output [B, T, D], the logits), in fp32, from one forward without grad."""
    outputs = []
    hooks = [layer.register_forward_hook(lambda m, args, out: outputs.append(out[0].float()))
             for layer in model.model.layers]
    try:
        with torch.no_grad():
            logits = model(input_ids, **kwargs).logits.float()
    finally:
        for hook in hooks:
            hook.remove()
    return outputs, logits


def layer_errors(float_model, quantized_model, input_ids: torch.Tensor, **kwargs) -> list[LayerError]:
    """Run both models on `input_ids` (extra kwargs, e.g. block_len, go to both forwards) and compare
    every decoder layer's output and the logits. Each layer sees its own model's inputs, so the
    errors accumulate down the stack, as they do in use."""
    ref_layers, ref_logits = layer_outputs(float_model, input_ids, **kwargs)
    q_layers, q_logits = layer_outputs(quantized_model, input_ids, **kwargs)

    def rel(a, b):
        return float((a - b).norm() / b.norm().clamp(min=1e-30))

    errors = [LayerError(f"layers.{i}", rel(q, r)) for i, (q, r) in enumerate(zip(q_layers, ref_layers))]
    return errors + [LayerError("logits", rel(q_logits, ref_logits))]
