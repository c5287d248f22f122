"""The embedded default model: shipped in the package, loadable as the model card shows."""

import os
import subprocess
import sys
from pathlib import Path

import clover

QUICK_START = """
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

model_id = {model_id!r}
tokenizer = AutoTokenizer.from_pretrained(model_id, trust_remote_code=True)
model = AutoModelForCausalLM.from_pretrained(
    model_id, trust_remote_code=True, dtype=torch.bfloat16, device_map="cpu",
).eval()

messages = [{{"role": "user", "content": {content!r}}}]
prompt = tokenizer.apply_chat_template(
    messages, tokenize=False, add_generation_prompt=True, enable_thinking=True,
)
inputs = tokenizer(prompt, add_special_tokens=False, return_tensors="pt").to("cpu")
output = model.generate(
    **inputs, max_new_tokens=24576, block_size=32, threshold=0.95, do_sample=False,
)
completion = output[0, inputs["input_ids"].shape[1]:]
print(tokenizer.decode(completion, skip_special_tokens=True))
import sys
from pathlib import Path
print("clover imported:", "clover" in sys.modules)
"""


def test_embedded_model_is_shipped_small_and_complete():
    path = clover.default_model_dir()
    names = {p.name for p in path.iterdir()}
    for required in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                     "model.safetensors", "bd_gdn_conv_right_weight.safetensors",
                     "bd_gdn_softmax_scalars.safetensors", "modeling_clover_moe.py"):
        assert required in names, required
    size = sum(p.stat().st_size for p in path.iterdir())
    assert size <= 25e6, f"embedded model is {size / 1e6:.1f} MB, limit 25 MB"


def test_model_card_quick_start_runs_without_importing_clover(tmp_path):
    from clover.data import get_task

    content = get_task("record").generate(seed=1, split="eval").prompt
    script = QUICK_START.format(model_id=str(clover.default_model_dir()), content=content)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "clover imported: False" in result.stdout
    assert "pilot" in result.stdout and "altitude" in result.stdout  # the record briefing's words


def test_embedded_model_carries_the_current_model_code():
    """The checkpoint's trust_remote_code files must equal the package's `clover/model/` files. In
    the repository they are symlinks to `../../model/*.py` (a wheel stores their content); a new
    model file needs a new link: `ln -s ../../model/NEW.py clover/assets/clover-tiny/`."""
    package = Path(clover.__file__).parent / "model"
    shipped = clover.default_model_dir()
    stale = [p.name for p in sorted(package.glob("*.py"))
             if not (shipped / p.name).is_file() or (shipped / p.name).read_bytes() != p.read_bytes()]
    assert not stale, f"stale remote code in {shipped}: {stale}"
