"""Loading errors name what is wrong: the missing shard, the missing key and where it was expected,
the key, file and both shapes of a mismatch. Absent bd_gdn_* files fall back to defaults."""

import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

import clover  # noqa: F401
from ckpt_helpers import hf_model, save_hf
from clover.model import CheckpointError, CloverMoeForCausalLM
from tiny import tiny_model

KEY = "model.layers.1.linear_attn.in_proj_z.weight"


@pytest.fixture
def saved(tmp_path):
    tiny_model(seed=1).save_pretrained(tmp_path / "ck")
    return tmp_path / "ck"


def rewrite(path, edit):
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path)


def test_missing_shard(tmp_path):
    tiny_model().save_pretrained(tmp_path / "ck", max_shard_size="40KB")
    shard = sorted((tmp_path / "ck").glob("model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(FileNotFoundError, match=shard.name):
        CloverMoeForCausalLM.from_pretrained(tmp_path / "ck")


def test_missing_weights_file(saved):
    (saved / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        CloverMoeForCausalLM.from_pretrained(saved)


def test_missing_key(saved):
    rewrite(saved / "model.safetensors", lambda t: t.pop(KEY))
    with pytest.raises(CheckpointError, match=rf"missing tensor '{KEY}'.*model\.safetensors"):
        CloverMoeForCausalLM.from_pretrained(saved)


def test_missing_expert(tmp_path):
    tiny_model().save_pretrained(tmp_path / "ck", experts="per_expert")
    key = "model.layers.2.mlp.experts.5.up_proj.weight"
    rewrite(tmp_path / "ck" / "model.safetensors", lambda t: t.pop(key))
    with pytest.raises(CheckpointError, match=key):
        CloverMoeForCausalLM.from_pretrained(tmp_path / "ck")


def test_wrong_shape(saved):
    rewrite(saved / "model.safetensors", lambda t: t.update({KEY: torch.zeros(3, 5)}))
    with pytest.raises(CheckpointError) as err:
        CloverMoeForCausalLM.from_pretrained(saved)
    message = str(err.value)
    assert KEY in message and "model.safetensors" in message and "[3, 5]" in message and "[32, 32]" in message


def test_index_lists_a_key_its_shard_lacks(tmp_path):
    tiny_model().save_pretrained(tmp_path / "ck", max_shard_size="40KB")
    index = json.loads((tmp_path / "ck" / "model.safetensors.index.json").read_text())
    shard = index["weight_map"]["model.norm.weight"]
    index["weight_map"]["model.extra.weight"] = shard
    (tmp_path / "ck" / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=f"'model.extra.weight'.*{shard}"):
        CloverMoeForCausalLM.from_pretrained(tmp_path / "ck")


def test_missing_block_param_in_present_file(saved):
    key = "model.layers.0.linear_attn.history_c"
    rewrite(saved / "bd_gdn_softmax_scalars.safetensors", lambda t: t.pop(key))
    with pytest.raises(CheckpointError, match=rf"{key}.*bd_gdn_softmax_scalars"):
        CloverMoeForCausalLM.from_pretrained(saved)


def test_absent_block_files_give_defaults_with_a_warning(saved):
    for name in ("bd_gdn_conv_right_weight.safetensors", "bd_gdn_softmax_scalars.safetensors"):
        (saved / name).unlink()
    with pytest.warns(UserWarning, match="bd_gdn_conv_right_weight"):
        model = CloverMoeForCausalLM.from_pretrained(saved)
    gdn = model.model.layers[0].linear_attn
    assert not gdn.conv_right_weight.any() and gdn.history_bias.item() == 0.0 and gdn.history_c.item() == 1.0
    assert math.isclose(gdn.logit_scale.item(), math.sqrt(8), rel_tol=1e-6)
    assert torch.isfinite(model(torch.tensor([[1, 2, 3, 4]]), block_len=2).logits).all()


def test_unconverted_or_absent_checkpoint(tmp_path):
    save_hf(hf_model(), tmp_path / "hf")
    with pytest.raises(ValueError, match="clover convert"):
        CloverMoeForCausalLM.from_pretrained(tmp_path / "hf")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        CloverMoeForCausalLM.from_pretrained(tmp_path / "nowhere")


@pytest.mark.parametrize("shard", ["../outside.safetensors", "../../x", "/etc/passwd", "sub/../../x", "", 7])
def test_shard_index_may_not_name_files_outside_the_folder(tmp_path, shard):
    tiny_model().save_pretrained(tmp_path / "ck", max_shard_size="40KB")
    index_path = tmp_path / "ck" / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    first = sorted(index["weight_map"].values())[0]
    (tmp_path / "outside.safetensors").write_bytes((tmp_path / "ck" / first).read_bytes())  # a valid decoy
    index["weight_map"] = {k: (shard if v == first else v) for k, v in index["weight_map"].items()}
    index_path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="outside the checkpoint folder|not a file name"):
        CloverMoeForCausalLM.from_pretrained(tmp_path / "ck")


def test_truncated_weights_file_is_a_checkpoint_error(saved):
    data = (saved / "model.safetensors").read_bytes()
    (saved / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        CloverMoeForCausalLM.from_pretrained(saved)


def test_unreadable_index_is_a_checkpoint_error(tmp_path):
    tiny_model().save_pretrained(tmp_path / "ck", max_shard_size="40KB")
    (tmp_path / "ck" / "model.safetensors.index.json").write_text('{"weight_map": [')
    with pytest.raises(CheckpointError, match="not readable JSON"):
        CloverMoeForCausalLM.from_pretrained(tmp_path / "ck")
