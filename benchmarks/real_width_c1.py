"""C1 on a release-layout checkpoint and its conversion: Clover's causal logits equal transformers'
Qwen3.5-MoE on the same weights, in bf16 and in fp32, within one copy of the weights in memory.

Usage:  python benchmarks/real_width_c1.py SRC DST [--tokens 64]
        (SRC: the release-layout checkpoint; DST: `clover convert SRC DST` with a reused mask id, so
        both models have the same vocabulary rows; `real_width_checkpoint.py` runs it)

1. Load DST (bf16) and check every parameter equals the tensor SRC stores for it, bit for bit (one
   stored tensor read at a time).
2. Build transformers' `Qwen3_5MoeForCausalLM` on `meta` and give it our Parameter objects
   (`assign=True`): no second copy of the weights.
3. bf16: both models on the same token ids.
4. fp32: both models again, with each unit (embedding, decoder layer, final norm, head) cast to fp32
   just before it runs and back to bf16 after it (the stored weights are bf16, so the cast is
   exact): an fp32 forward that holds at most one fp32 layer (~3.2 GB for a 256-expert MoE layer)
   next to the bf16 weights. This is the fp32 reference that judges the bf16 errors.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from clover.model import CloverMoeForCausalLM  # noqa: E402
from clover.model.checkpoint_load import params_on_meta  # noqa: E402
from clover.model.checkpoint_names import block_file, expert_key, is_fused_experts, normalize_key  # noqa: E402


def stored_equals_loaded(src: Path, model: CloverMoeForCausalLM) -> int:
    """Compare each stored text-model tensor of `src` with the loaded parameter (or the expert's
    slice of it); raise on the first difference. Returns the number of tensors compared."""
    params = dict(model.named_parameters())
    by_key = {}
    for name, p in params.items():
        if is_fused_experts(name):
            half = p.shape[1] // 2
            for e in range(p.shape[0]):
                if name.endswith("gate_up_proj"):
                    by_key[expert_key(name, e, "gate_proj")] = p[e, :half]
                    by_key[expert_key(name, e, "up_proj")] = p[e, half:]
                else:
                    by_key[expert_key(name, e, "down_proj")] = p[e]
        elif block_file(name) is None:
            by_key[name] = p
    weight_map = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
    compared = 0
    for key, shard in weight_map.items():
        name = normalize_key(key)
        if name is None:  # mtp.*: not part of the text model
            continue
        with safe_open(src / shard, framework="pt") as f:
            stored = f.get_tensor(key)
        if not torch.equal(stored, by_key.pop(name).detach()):
            raise AssertionError(f"loaded '{name}' differs from '{key}' in {src / shard}")
        compared += 1
    if by_key:
        raise AssertionError(f"{len(by_key)} loaded tensors have no stored source, e.g. {list(by_key)[:3]}")
    return compared


def sharing_reference(src: Path, model: CloverMoeForCausalLM) -> Qwen3_5MoeForCausalLM:
    """transformers' model of SRC's text config holding our Parameter objects (no weight copy)."""
    text = json.loads((src / "config.json").read_text())["text_config"]
    text = {k: v for k, v in text.items() if k not in ("dtype", "torch_dtype")}
    with params_on_meta():  # parameters on meta, buffers (rotary frequencies) real
        reference = Qwen3_5MoeForCausalLM(Qwen3_5MoeTextConfig(**text))
    state = {k: v for k, v in model.state_dict(keep_vars=True).items() if block_file(k) is None}
    reference.load_state_dict(state, strict=True, assign=True)
    return reference.eval()


def units(model) -> list[torch.nn.Module]:
    """The modules that the fp32 pass casts one at a time (same names in both models)."""
    return [model.model.embed_tokens, *model.model.layers, model.model.norm, model.lm_head]


def fp32_one_unit_at_a_time(model, run):
    """run() with each unit of `model` in fp32 only while it runs. Casts `.data` of the shared
    Parameter objects, so the other model sees the same (bf16 again afterwards) weights."""
    def up(module, args):
        for p in module.parameters():
            p.data = p.data.float()

    def down(module, args, output):
        for p in module.parameters():
            p.data = p.data.to(torch.bfloat16)

    handles = [h for u in units(model) for h in (u.register_forward_pre_hook(up), u.register_forward_hook(down))]
    try:
        return run()
    finally:
        for h in handles:
            h.remove()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def compare(ours: torch.Tensor, theirs: torch.Tensor) -> dict:
    return {"max_abs": (ours - theirs).abs().max().item(), "rel_l2": rel(ours, theirs),
            "top1_agree": (ours.argmax(-1) == theirs.argmax(-1)).float().mean().item()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path)
    parser.add_argument("dst", type=Path)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    model = CloverMoeForCausalLM.from_pretrained(args.dst, dtype=torch.bfloat16)
    print(f"loaded {args.dst} in {time.perf_counter() - start:.0f} s", flush=True)
    print(f"stored == loaded, bit for bit: {stored_equals_loaded(args.src, model)} tensors", flush=True)
    reference = sharing_reference(args.src, model)
    vocab = reference.config.vocab_size
    ids = torch.randint(0, model.config.mask_token_id, (1, args.tokens), generator=torch.Generator().manual_seed(0))
    logits = {}
    with torch.no_grad():
        for name, m in (("ours", model), ("transformers", reference)):
            logits[f"{name} bf16"] = m(ids).logits[..., :vocab].float()
            logits[f"{name} fp32"] = fp32_one_unit_at_a_time(m, lambda: m(ids).logits[..., :vocab].float())
            print(f"{name} done at {time.perf_counter() - start:.0f} s", flush=True)
    ref = logits["transformers fp32"]
    rows = {"ours bf16 vs transformers bf16": compare(logits["ours bf16"], logits["transformers bf16"]),
            "ours fp32 vs transformers fp32": compare(logits["ours fp32"], ref),
            "ours bf16 vs fp32 reference": compare(logits["ours bf16"], ref),
            "transformers bf16 vs fp32 reference": compare(logits["transformers bf16"], ref)}
    print(f"{args.tokens} tokens, vocab {vocab}; |logits| max {ref.abs().max().item():.2f}, std {ref.std().item():.3f}")
    print("| comparison | max abs | rel L2 | top-1 agree |\n|---|---:|---:|---:|")
    for label, r in rows.items():
        print(f"| {label} | {r['max_abs']:.2e} | {r['rel_l2']:.2e} | {r['top1_agree']:.3f} |")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
