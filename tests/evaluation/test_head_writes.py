"""`benchmarks/head_writes.py`: each head's write is the norm of its own block of `o_proj` columns."""

import torch
from benchmark_script import load_benchmark
from safetensors.torch import save_file

probe = load_benchmark("head_writes")


def test_each_head_is_measured_on_its_own_columns(tmp_path):
    o_proj = torch.zeros(6, 3 * 4)  # [hidden, H * D]: 3 heads of 4 dims
    o_proj[:, 0:4] = 1.0  # head 0: 24 ones, norm sqrt(24)
    o_proj[2, 9] = 3.0  # head 2: one element
    shard = tmp_path / "shard-00001-model-00001-of-00001.safetensors"
    save_file({"model.model.layers.3.self_attn.o_proj.weight": o_proj,
               "model.model.layers.3.self_attn.q_proj.weight": torch.ones(2, 2),
               "optim.model.layers.3.self_attn.o_proj.weight.exp_avg": torch.ones_like(o_proj)}, shard)
    writes = probe.head_writes(shard, head_dim=4)
    assert list(writes) == [3]
    torch.testing.assert_close(torch.tensor(writes[3]), torch.tensor([24 ** 0.5, 0.0, 3.0]))
