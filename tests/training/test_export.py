"""Export of a trained model (clover/training/export.py): `export_dtype: "bf16"` stores bf16 weights,
leaves the live fp32 weights as they were, and loads on CPU as fp32 (`--dtype auto`) holding exactly
the bf16-rounded weights."""

import torch
from safetensors.torch import load_file
from tiny import random_ids, tiny_model

from clover.loading import LoadOptions, load_model
from clover.training.export import export_checkpoint


def test_bf16_export_stores_bf16_and_loads_as_the_rounded_model_in_fp32(tmp_path):
    model = tiny_model(seed=1)
    live = {k: v.clone() for k, v in model.state_dict().items()}
    directory = export_checkpoint(model, tmp_path / "final", eos_ids=(1,), pad_id=0, block_size=8, dtype="bf16")

    stored = load_file(directory / "model.safetensors")
    assert {v.dtype for v in stored.values() if v.is_floating_point()} == {torch.bfloat16}
    assert all(torch.equal(v, live[k]) for k, v in model.state_dict().items())  # the live model is not rounded

    rounded_state = {k: v.to(torch.bfloat16).float() if v.is_floating_point() else v for k, v in live.items()}
    loaded = load_model(directory, LoadOptions(device="cpu"))
    assert loaded.dtype == torch.float32
    state = loaded.state_dict()
    assert state.keys() == rounded_state.keys()
    assert all(torch.equal(state[k], v) for k, v in rounded_state.items())

    rounded = tiny_model(seed=1)
    rounded.load_state_dict(rounded_state)
    seq = random_ids(1, 12)
    with torch.no_grad():  # it computes what the rounded weights compute, in fp32
        torch.testing.assert_close(loaded(seq).logits, rounded(seq).logits, rtol=0, atol=1e-6)
