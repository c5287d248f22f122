"""A saved or converted checkpoint loads with `trust_remote_code=True` in a process that never
imports `clover` (the model code travels in the checkpoint), reproduces the in-process logits, and
the remote class can save a checkpoint that loads again."""

import json

import torch
from transformers import AutoModelForCausalLM

import clover  # noqa: F401
from ckpt_helpers import hf_model, logits, run_python, save_hf
from clover.checkpoint import convert_checkpoint
from tiny import tiny_model

IDS = [[3, 17, 42, 99, 5, 64, 8, 120]]
SCRIPT = """
import json, sys
import torch
from transformers import AutoConfig, AutoModelForCausalLM
saved, converted = {paths!r}
ids = torch.tensor({ids!r})
config = AutoConfig.from_pretrained(saved, trust_remote_code=True)
model = AutoModelForCausalLM.from_pretrained(saved, trust_remote_code=True)
with torch.no_grad():
    causal, block = model(ids).logits, model(ids, block_len=4).logits
model.save_pretrained(saved + "-resaved")
again = AutoModelForCausalLM.from_pretrained(saved + "-resaved", trust_remote_code=True)
with torch.no_grad():
    resaved_same = torch.equal(again(ids, block_len=4).logits, block)
torch.save({{"causal": causal, "block": block}}, saved + ".pt")
conv = AutoModelForCausalLM.from_pretrained(converted, trust_remote_code=True)
print(json.dumps(dict(
    config_module=type(config).__module__, model_module=type(model).__module__,
    model_class=type(model).__name__, resaved_same=resaved_same,
    converted_module=type(conv).__module__, threshold=getattr(conv.generation_config, "threshold", None),
    clover_imported=any(name == "clover" or name.startswith("clover.") for name in sys.modules))))
"""


def test_trust_remote_code_in_a_fresh_process(tmp_path):
    saved, converted = tmp_path / "saved", tmp_path / "converted"
    model = tiny_model(seed=11)
    with torch.no_grad():
        model.model.layers[0].linear_attn.history_bias.fill_(0.7)
    model.save_pretrained(saved)
    save_hf(hf_model(seed=12), tmp_path / "hf")
    convert_checkpoint(tmp_path / "hf", converted)
    env = {"HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    script = SCRIPT.format(paths=[str(saved), str(converted)], ids=IDS)
    out = json.loads(run_python(script, cwd=tmp_path, env=env).splitlines()[-1])
    assert out["clover_imported"] is False
    for key in ("config_module", "model_module", "converted_module"):
        assert out[key].startswith("transformers_modules"), out
    assert out["model_class"] == "CloverMoeForCausalLM" and out["resaved_same"]
    assert out["threshold"] == 0.95  # custom generation_config.json fields survive
    remote = torch.load(str(saved) + ".pt")
    local = AutoModelForCausalLM.from_pretrained(saved)
    ids = torch.tensor(IDS)
    assert torch.allclose(remote["causal"], logits(local, ids), atol=1e-6, rtol=0)
    assert torch.allclose(remote["block"], logits(local, ids, block_len=4), atol=1e-6, rtol=0)
