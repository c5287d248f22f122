"""One loading path (`clover.loading`) behind the same --device/--dtype/--quantize flags of
generate, eval and serve; from_pretrained's transformers keywords honored or refused."""

import re

import pytest
import torch

import clover
import clover.loading
from clover.cli.main import build_parser
from clover.loading import LoadOptions, load_model, load_model_and_tokenizer


def test_options_refuse_unknown_names():
    with pytest.raises(ValueError, match="--dtype 'float8'.*bf16"):
        LoadOptions(dtype="float8")
    with pytest.raises(ValueError, match="--quantize 'int3'.*int8"):
        LoadOptions(quantize="int3")


def test_auto_dtype_on_cpu_is_fp32_and_names_are_honored():
    directory = clover.default_model_dir()
    model, tokenizer = load_model_and_tokenizer(directory, LoadOptions(device="cpu"))
    assert model.device.type == "cpu" and model.dtype == torch.float32 and not model.training
    assert tokenizer.decode(tokenizer("no-fly zone").input_ids) == "no-fly zone"
    bf16 = load_model(directory, LoadOptions(device="cpu", dtype="bf16"))
    assert {p.dtype for p in bf16.parameters() if p.is_floating_point()} == {torch.bfloat16}


def test_quantize_flag_quantizes_the_loaded_model_in_place():
    from clover.model.quantized import QuantizedLinear, QuantizedWeight

    directory = clover.default_model_dir()
    model = load_model(directory, LoadOptions(device="cpu", quantize="int8"))
    quantized = [m for m in model.modules() if isinstance(m, (QuantizedLinear, QuantizedWeight))]
    assert quantized and all(m.bits == 8 for m in quantized)
    assert model.config.quantization_config["bits"] == 8
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        reference = load_model(directory, LoadOptions(device="cpu"))(ids).logits
        logits = model(ids).logits
    assert (logits - reference).abs().max() < 0.05 * reference.abs().max()
    with pytest.raises(ValueError, match="already quantized"):
        clover.loading.quantize(model, "int4")


def test_from_pretrained_loading_info_and_quantization_config():
    from clover import CloverMoeForCausalLM

    model, info = CloverMoeForCausalLM.from_pretrained(clover.default_model_dir(), output_loading_info=True)
    assert isinstance(model, CloverMoeForCausalLM)
    assert info == {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": [], "error_msgs": []}
    with pytest.raises(ValueError, match="quantization_config=.*not supported"):
        CloverMoeForCausalLM.from_pretrained(clover.default_model_dir(), quantization_config={"bits": 4})


@pytest.mark.parametrize("command", ["generate", "eval", "serve"])
def test_model_commands_share_the_loading_flags(command):
    args = build_parser().parse_args([command, "--device", "cpu", "--dtype", "bf16", "--quantize", "int4"])
    assert (args.model, args.device, args.dtype, args.quantize) == (None, "cpu", "bf16", "int4")
    defaults = build_parser().parse_args([command])
    assert (defaults.device, defaults.dtype, defaults.quantize) == ("auto", "auto", None)


def test_trainer_weights_of_another_architecture_are_refused(model, monkeypatch):
    """`--checkpoint` copies a trainer checkpoint's tensors in; one that lacks a tensor, has an extra
    one or another shape is refused by name, and the model's weights are left as they were."""
    import clover.training.checkpointing as checkpointing
    from clover.loading import load_trainer_weights

    own = {k: v.clone() for k, v in model.state_dict().items()}
    first, second = list(own)[:2]
    for tensors, named in (({k: v for k, v in own.items() if k != first}, first),
                           ({**own, "extra.weight": torch.zeros(1)}, "extra.weight"),
                           ({**own, second: torch.zeros(3)}, second)):
        monkeypatch.setattr(checkpointing, "load_model_tensors", lambda path, t=tensors: t)
        with pytest.raises(ValueError, match=re.escape(named)):
            load_trainer_weights(model, "run/checkpoints/step-0000001")
    assert all(torch.equal(v, own[k]) for k, v in model.state_dict().items())
    shifted = {k: v + 1 for k, v in own.items()}
    monkeypatch.setattr(checkpointing, "load_model_tensors", lambda path: shifted)
    load_trainer_weights(model, "run/checkpoints/step-0000001")
    assert all(torch.equal(v, shifted[k]) for k, v in model.state_dict().items())
