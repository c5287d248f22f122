"""Loading maps tensors lazily: peak host memory grows by about the checkpoint size (the loaded
model itself), not twice it, and the loaded model works."""

import json
from pathlib import Path

import pytest

from ckpt_helpers import run_python
from clover.model import CloverMoeConfig, CloverMoeForCausalLM
from tiny import tiny_model

REPO = Path(__file__).resolve().parents[2]
PROBE = """
import gc, json, resource, sys, threading, time
import psutil, torch
sys.path.insert(0, {repo!r})
import clover
from transformers import AutoModelForCausalLM


def rss_anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024


AutoModelForCausalLM.from_pretrained({small!r})  # fault in the loading code before measuring
gc.collect()
peak_anon, done = [0], threading.Event()
def sample():
    while not done.is_set():
        peak_anon[0] = max(peak_anon[0], rss_anon())
        time.sleep(0.002)
threading.Thread(target=sample, daemon=True).start()
base, base_anon = psutil.Process().memory_info().rss, rss_anon()
model = AutoModelForCausalLM.from_pretrained({path!r})
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
done.set()
with torch.no_grad():
    out = model(torch.tensor([[1, 2, 3, 4]]), block_len=2).logits
print(json.dumps({{"increase": peak - base, "anon_increase": peak_anon[0] - base_anon,
                   "finite": bool(torch.isfinite(out).all()), "shape": list(out.shape)}}))
"""


@pytest.fixture(scope="module")
def big_checkpoint(tmp_path_factory):
    """~300 MB fp32: two 36000 x 1024 matrices (embedding, head) and two small layers; and a tiny one."""
    config = CloverMoeConfig(
        vocab_size=36000, hidden_size=1024, num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"], num_attention_heads=2, num_key_value_heads=1,
        head_dim=8, linear_num_key_heads=1, linear_num_value_heads=1, linear_key_head_dim=8,
        linear_value_head_dim=8, num_experts=2, num_experts_per_tok=1, moe_intermediate_size=8,
        shared_expert_intermediate_size=8, mask_token_id=35999)
    root = tmp_path_factory.mktemp("big")
    CloverMoeForCausalLM(config).save_pretrained(root / "big")
    tiny_model().save_pretrained(root / "small")
    return root


def test_peak_memory_stays_near_checkpoint_size(big_checkpoint, tmp_path):
    size = sum(p.stat().st_size for p in (big_checkpoint / "big").glob("*.safetensors"))
    assert size > 200e6
    probe = PROBE.format(repo=str(REPO), path=str(big_checkpoint / "big"), small=str(big_checkpoint / "small"))
    out = json.loads(run_python(probe, cwd=tmp_path).splitlines()[-1])
    assert out["finite"] and out["shape"] == [1, 4, 36000]
    grew, anon = out["increase"] / 1e6, out["anon_increase"] / 1e6
    message = f"peak RSS grew {grew:.0f} MB (anonymous {anon:.0f} MB) for a {size / 1e6:.0f} MB checkpoint"
    # The memory a load really costs is anonymous (the model's tensors): it must stay near one copy
    # of the checkpoint. Total RSS also counts the mmapped file's pages, which are page cache
    # (reclaimable, shared) and whose residency depends on what ran before: bounded more loosely.
    assert anon < 1.3 * size / 1e6, message
    assert grew < 2.0 * size / 1e6, message
