"""Checkpoint names of the Clover layout (SPEC §9): file names, key prefixes, block-mode keys and the
per-expert / fused expert forms. The rest of the code never spells a weight name.

In-memory parameter names equal the backbone checkpoint names, except that routed experts are one
fused pair per layer (`…mlp.experts.gate_up_proj [E, 2I, H]`, `…mlp.experts.down_proj [E, H, I]`),
which a checkpoint may also store per expert (`…mlp.experts.{e}.{gate,up,down}_proj.weight`).
"""

import torch

WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
CONV_RIGHT_FILE = "bd_gdn_conv_right_weight.safetensors"
SCALARS_FILE = "bd_gdn_softmax_scalars.safetensors"
BLOCK_FILES = (CONV_RIGHT_FILE, SCALARS_FILE)
CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"

AUTO_MAP = {
    "AutoConfig": "configuration_clover_moe.CloverMoeConfig",
    "AutoModelForCausalLM": "modeling_clover_moe.CloverMoeForCausalLM",
}

MULTIMODAL_TEXT_PREFIX = "model.language_model."
IGNORED_PREFIXES = ("mtp.", "model.visual.", "visual.")
SCALAR_NAMES = ("logit_scale", "history_bias", "history_c")
BLOCK_PARAM_ATTRS = ("conv_right_weight",) + SCALAR_NAMES
VOCAB_ROW_KEYS = ("model.embed_tokens.weight", "lm_head.weight")  # one row per token id
FUSED_GATE_UP = "mlp.experts.gate_up_proj"
FUSED_DOWN = "mlp.experts.down_proj"


def normalize_key(key: str) -> str | None:
    """Stored key -> in-memory naming (`model.language_model.` -> `model.`); None for keys that are
    not part of the text model (`mtp.*`, vision tower)."""
    if key.startswith(IGNORED_PREFIXES):
        return None
    if key.startswith(MULTIMODAL_TEXT_PREFIX):
        return "model." + key[len(MULTIMODAL_TEXT_PREFIX):]
    return key


def block_file(name: str) -> str | None:
    """The `bd_gdn_*` file that holds a block-mode parameter, or None for a backbone parameter."""
    if name.endswith(".linear_attn.conv_right_weight"):
        return CONV_RIGHT_FILE
    if any(name.endswith(f".linear_attn.{s}") for s in SCALAR_NAMES):
        return SCALARS_FILE
    return None


def is_fused_experts(name: str) -> bool:
    return name.endswith((FUSED_GATE_UP, FUSED_DOWN))


def expert_key(fused_name: str, expert: int, proj: str) -> str:
    """`…mlp.experts.gate_up_proj`, 3, "up_proj" -> `…mlp.experts.3.up_proj.weight`."""
    prefix = fused_name.rsplit(".", 1)[0]
    return f"{prefix}.{expert}.{proj}.weight"


def expert_projs(fused_name: str) -> tuple[str, ...]:
    """The per-expert projections that make up one fused parameter (gate_up = cat(gate, up), dim 0)."""
    return ("gate_proj", "up_proj") if fused_name.endswith(FUSED_GATE_UP) else ("down_proj",)


def split_experts(name: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
    """A fused expert parameter -> its per-expert checkpoint tensors (views, not copies).

    gate_up [E, 2I, H] -> gate_proj, up_proj [I, H] each; down [E, H, I] -> down_proj [H, I]."""
    out = {}
    for e in range(tensor.shape[0]):
        if name.endswith(FUSED_GATE_UP):
            gate, up = tensor[e].chunk(2, dim=0)  # [I, H] each
            out[expert_key(name, e, "gate_proj")] = gate
            out[expert_key(name, e, "up_proj")] = up
        else:
            out[expert_key(name, e, "down_proj")] = tensor[e]
    return out


def shard_name(i: int, n: int) -> str:
    return f"model-{i + 1:05d}-of-{n:05d}.safetensors"


def is_block_attr(attr: str) -> bool:
    """Attribute name of a block-mode parameter (kept materialised at meta init: its default is its init)."""
    return attr in BLOCK_PARAM_ATTRS
