"""Settings precedence: keyword > checkpoint generation_config.json > SPEC §2 defaults."""

import json

import torch
from transformers import GenerationConfig

from clover.model.generation_config import SPEC_DEFAULTS, resolve_config
from tiny import tiny_config
from decoding_helpers import one_thread, peaked_model, prompt  # noqa: F401


def test_spec_defaults_without_a_checkpoint_config():
    cfg = resolve_config(None, None, {})
    for name, value in SPEC_DEFAULTS.items():
        assert getattr(cfg, name) == value, name
    assert cfg.fuse_commit and cfg.prefill_chunk_size == 4096 and cfg.mode == "block_diffusion"


def test_checkpoint_values_beat_defaults_and_keywords_beat_both(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps(dict(
        max_new_tokens=64, threshold=0.5, repetition_penalty=1.0, top_k=0, dllm_length_penalty=2.0,
        eos_token_id=[5, 6], pad_token_id=1, think_start_token_id=3, think_end_token_id=4)))
    checkpoint = GenerationConfig.from_pretrained(tmp_path)
    cfg = resolve_config(checkpoint, tiny_config(), {"threshold": 0.8, "block_size": 8})
    assert cfg.threshold == 0.8 and cfg.block_size == 8  # keyword
    assert cfg.max_new_tokens == 64 and cfg.dllm_length_penalty == 2.0  # checkpoint
    assert cfg.repetition_penalty == 1.0  # set by the checkpoint, though it is transformers' "off"
    assert cfg.eos_token_id == (5, 6) and cfg.pad_token_id == 1 and cfg.think_end_token_id == 4
    assert cfg.presence_penalty == 0.9 and cfg.dllm_think_end_start == 4096  # SPEC defaults


def test_model_config_supplies_block_size_and_threshold():
    config = tiny_config(block_size=8, denoising_config={"algorithm": "low_confidence", "threshold": 0.6})
    cfg = resolve_config(None, config, {"eos_token_id": 3})
    assert cfg.block_size == 8 and cfg.threshold == 0.6 and cfg.eos_token_id == (3,)


def test_generate_reads_the_model_generation_config():
    model = peaked_model()
    ids = torch.tensor([prompt(5)])
    model.generation_config = GenerationConfig(max_new_tokens=6, block_size=2, threshold=1.0)
    out = model.generate(ids, return_dict_in_generate=True)
    assert out.sequences.shape[1] <= 5 + 6
    assert out.rows[0].steps_per_block[0] == 2  # threshold 1.0: one fill per step
    out = model.generate(ids, max_new_tokens=3, return_dict_in_generate=True)
    assert out.rows[0].new_tokens <= 3
