"""`clover convert` streams: converting a release-layout checkpoint (sharded, per-expert keys) holds
about one output shard in memory (resident set: the tensors of a shard map the source file's pages),
not the checkpoint. (The real-widths slice, 8.8 GB: peak RSS
0.63x its bytes, benchmarks/real_width_checkpoint.py.)"""

import json
from pathlib import Path

from ckpt_helpers import run_python
from clover.checkpoint.release_layout import write_release_checkpoint

REPO = Path(__file__).resolve().parents[2]
# ~110 MB of bf16, almost all in 4 x 32 experts of 3 x 256 x 512 (each tensor 256 KB)
WIDE = dict(vocab_size=4096, hidden_size=512, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
            linear_value_head_dim=32, num_experts=32, num_experts_per_tok=4, moe_intermediate_size=256,
            shared_expert_intermediate_size=256, eos_token_id=4095, pad_token_id=4095)
PROBE = """
import json, sys, threading, time
sys.path.insert(0, {repo!r})
from clover.checkpoint import ConvertOptions, convert_checkpoint


def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024


convert_checkpoint({small!r}, {small_out!r}, ConvertOptions(mask_token_id=254))  # fault in the code first
peak, done = [0], threading.Event()
def sample():
    while not done.is_set():
        peak[0] = max(peak[0], rss())
        time.sleep(0.002)
threading.Thread(target=sample, daemon=True).start()
base = rss()
convert_checkpoint({src!r}, {dst!r}, ConvertOptions(mask_token_id=4094, max_shard_size="20MB"), progress=True)
done.set()
print(json.dumps({{"rss_increase": peak[0] - base}}))
"""


def test_convert_holds_about_one_shard(tmp_path):
    src = write_release_checkpoint(tmp_path / "release", WIDE, max_shard_bytes=20_000_000)
    small = write_release_checkpoint(tmp_path / "small", dict(WIDE, vocab_size=256, hidden_size=64, num_experts=4,
                                                              eos_token_id=255, pad_token_id=255))
    size = sum(p.stat().st_size for p in src.glob("*.safetensors"))
    assert size > 100e6
    probe = PROBE.format(repo=str(REPO), src=str(src), dst=str(tmp_path / "out"), small=str(small),
                         small_out=str(tmp_path / "small_out"))
    grew = json.loads(run_python(probe, cwd=tmp_path).splitlines()[-1])["rss_increase"]
    assert (tmp_path / "out" / "model.safetensors.index.json").is_file()
    # one 20 MB output shard at a time, whose tensors map pages of one or two 20 MB source shards (RSS
    # counts them): 0.43x here; a conversion that held the whole checkpoint would be over 1x
    assert grew < 0.7 * size, f"converting a {size / 1e6:.0f} MB checkpoint grew RSS by {grew / 1e6:.0f} MB"
