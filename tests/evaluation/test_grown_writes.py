"""`benchmarks/grown_writes.py`: each head's write is the norm of its own block of `o_proj` columns,
each expert unit's the norm of its own down-projection column."""

import torch
from benchmark_script import load_benchmark
from safetensors.torch import save_file

probe = load_benchmark("grown_writes")


def test_each_unit_is_measured_on_its_own_columns(tmp_path):
    o_proj = torch.zeros(6, 3 * 4)  # [hidden, H * D]: 3 heads of 4 dims
    o_proj[:, 0:4] = 1.0  # head 0: 24 ones, norm sqrt(24)
    o_proj[2, 9] = 3.0  # head 2: one element
    down = torch.zeros(2, 6, 3)  # [E, hidden, I]: 2 experts of 3 units
    down[1, :, 2] = 2.0  # expert 1's unit 2: norm 2 sqrt(6)
    shared = torch.zeros(6, 5)  # [hidden, I]
    shared[0, 4] = -1.0
    shard = tmp_path / "shard-00001-model-00001-of-00001.safetensors"
    save_file({"model.model.layers.3.self_attn.o_proj.weight": o_proj,
               "model.model.layers.3.mlp.experts.down_proj": down,
               "model.model.layers.3.mlp.shared_expert.down_proj.weight": shared,
               "model.model.layers.3.self_attn.q_proj.weight": torch.ones(2, 2),
               "optim.model.layers.3.self_attn.o_proj.weight.exp_avg": torch.ones_like(o_proj)}, shard)
    writes = probe.unit_writes(shard, head_dim=4)
    assert sorted(writes) == [("expert units", 3), ("heads", 3), ("shared units", 3)]
    torch.testing.assert_close(writes["heads", 3], torch.tensor([24 ** 0.5, 0.0, 3.0]))
    torch.testing.assert_close(writes["expert units", 3], torch.tensor([[0.0, 0, 0], [0, 0, 2 * 6 ** 0.5]]))
    torch.testing.assert_close(writes["shared units", 3], torch.tensor([0.0, 0, 0, 0, 1]))
