"""Random-weight checkpoints laid out like the Hugging Face release of a Qwen3.5-MoE / Clover model.

The layout `clover convert` meets in the wild: `Qwen3_5MoeForConditionalGeneration` config
(`model_type qwen3_5_moe`, text fields under `text_config`), weights sharded with an index, routed
experts stored per expert (`…mlp.experts.{e}.{gate,up,down}_proj.weight`), text weights under
`model.language_model.`, and multi-token-prediction weights (`mtp.*`) that the text model does not
use. `REAL_WIDTHS_SLICE` is the real model's per-layer shapes on 4 layers (3 GDN, 1 attention): about
4.4B parameters (3.2B of them routed experts), 8.8 GB in bf16. Tensors are generated and written one shard at a time, so peak
memory is about one shard.
"""

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

from clover.model.checkpoint_names import INDEX_FILE, MULTIMODAL_TEXT_PREFIX, is_fused_experts, shard_name

# transformers' Qwen3_5MoeTextConfig defaults are the released widths (hidden 2048, 256 experts top-8,
# moe_intermediate 512 + shared expert, GQA 16/2 with head_dim 256, partial rotary 0.25, GDN 16 key /
# 32 value heads of 128, conv 4, vocab 248320); the slice keeps 4 of the 40 layers.
REAL_WIDTHS_SLICE = {"num_hidden_layers": 4}


def _mtp_shapes(hidden: int) -> dict[str, tuple[int, ...]]:
    return {"mtp.fc.weight": (hidden, 2 * hidden), "mtp.norm.weight": (hidden,),
            "mtp.pre_fc_norm_embedding.weight": (hidden,), "mtp.pre_fc_norm_hidden.weight": (hidden,)}


def release_shapes(text: Qwen3_5MoeTextConfig) -> dict[str, tuple[int, ...]]:
    """Stored key -> shape, in model order, for the release layout of `text`."""
    with torch.device("meta"):
        model = Qwen3_5MoeForCausalLM(text)
    shapes = {}
    for name, p in model.named_parameters():
        stored = MULTIMODAL_TEXT_PREFIX + name[len("model."):] if name.startswith("model.") else name
        if not is_fused_experts(name):
            shapes[stored] = tuple(p.shape)
            continue
        prefix = stored.rsplit(".", 1)[0]
        e, rows, cols = p.shape
        projs = ("gate_proj", "up_proj") if name.endswith("gate_up_proj") else ("down_proj",)
        for i in range(e):
            for proj in projs:
                shapes[f"{prefix}.{i}.{proj}.weight"] = (rows // len(projs), cols)
    return shapes | _mtp_shapes(text.hidden_size)


def _random(key: str, shape: tuple[int, ...], generator: torch.Generator, std: float) -> torch.Tensor:
    if key.endswith("A_log"):
        return torch.empty(shape).uniform_(1, 16, generator=generator).log()
    if key.endswith("dt_bias"):
        return torch.ones(shape)
    return torch.randn(shape, generator=generator) * std


def write_release_checkpoint(path: str | Path, text_overrides: dict | None = None, seed: int = 0,
                             dtype: torch.dtype = torch.bfloat16, std: float = 0.02,
                             max_shard_bytes: int = 2 << 30) -> Path:
    """Write a random checkpoint in the release layout to `path`; return it. `text_overrides` are
    `Qwen3_5MoeTextConfig` fields (default: `REAL_WIDTHS_SLICE`)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    text = Qwen3_5MoeTextConfig(**(REAL_WIDTHS_SLICE if text_overrides is None else text_overrides))
    shapes = release_shapes(text)
    shards: list[list[str]] = [[]]
    size = 0
    for key, shape in shapes.items():
        nbytes = torch.Size(shape).numel() * dtype.itemsize
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(key)
        size += nbytes
    generator = torch.Generator().manual_seed(seed)
    weight_map = {}
    for i, keys in enumerate(shards):
        name = shard_name(i, len(shards))
        save_file({k: _random(k, shapes[k], generator, std).to(dtype) for k in keys}, path / name,
                  metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(keys, name))
    total = sum(torch.Size(s).numel() for s in shapes.values()) * dtype.itemsize
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (path / INDEX_FILE).write_text(json.dumps(index, indent=2))
    text_dict = text.to_dict() | {"dtype": str(dtype).removeprefix("torch.")}
    config = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
              "text_config": text_dict, "vision_config": {"depth": 1}, "tie_word_embeddings": False}
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return path
