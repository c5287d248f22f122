"""Builders for checkpoint tests: random transformers Qwen3.5-MoE models, tiny tokenizers, subprocesses."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

HF_BASE = dict(
    vocab_size=128, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
    linear_value_head_dim=8, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
    shared_expert_intermediate_size=16, eos_token_id=[125, 127], pad_token_id=127,
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]


def hf_model(seed: int = 0, std: float = 0.2, **overrides) -> Qwen3_5MoeForCausalLM:
    """A transformers Qwen3.5-MoE text model with every weight ~ N(0, std) (A_log, dt_bias kept)."""
    torch.manual_seed(seed)
    model = Qwen3_5MoeForCausalLM(Qwen3_5MoeTextConfig(**{**HF_BASE, **overrides})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.endswith(("A_log", "dt_bias")):
                p.normal_(0.0, std)
    return model


def save_hf(model, path: Path) -> Path:
    model.save_pretrained(path)
    return path


def make_tokenizer(path: Path, num_tokens: int) -> Tokenizer:
    """A WordLevel tokenizer of exactly `num_tokens` ids: words w0.. and [UNK], then the SPECIALS as
    added special tokens (so the next free id is `num_tokens`). Writes tokenizer.json and a
    tokenizer_config.json listing the specials."""
    words = num_tokens - len(SPECIALS) - 1
    vocab = {f"w{i}": i for i in range(words)} | {"[UNK]": words}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    decoder = {str(words + 1 + i): {"content": s, "special": True} for i, s in enumerate(SPECIALS)}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
              "unk_token": "[UNK]", "added_tokens_decoder": decoder, "chat_template": "{{ messages }}"}
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return tok


def logits(model, ids: torch.Tensor, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        return model(ids, **kwargs).logits


def run_python(code: str, cwd: Path, env: dict | None = None, timeout: int = 120) -> str:
    """Run `python -c code` in a fresh interpreter that cannot import this repo (cwd elsewhere, no
    PYTHONPATH); return stdout, failing with stderr on a non-zero exit. It runs with this process's
    torch thread count, so its logits can be compared bit for bit with ones computed here (the
    kernels split their sums by thread count)."""
    full_env = ({k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
                | {"OMP_NUM_THREADS": str(torch.get_num_threads())} | (env or {}))
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout
