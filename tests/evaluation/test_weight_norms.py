"""`benchmarks/weight_norms.py`: the norms of the matrices weight decay acts on, by part."""

import torch
from benchmark_script import load_benchmark

from clover import default_model_dir

probe = load_benchmark("weight_norms")


def test_the_parts_split_every_decayed_matrix_and_add_up_to_the_whole():
    model, _ = probe.model_or_trainer_checkpoint(str(default_model_dir()))
    norms = probe.matrix_norms(model)
    matrices = [p for p in model.parameters() if p.ndim >= 2]
    grouped = probe.parts(model)
    assert set(grouped) == {"embedding", "attention", "deltanet", "experts", "router+shared"} == set(norms) - {"all"}
    assert sorted(id(p) for ps in grouped.values() for p in ps) == sorted(id(p) for p in matrices)
    assert any(p is model.model.embed_tokens.weight for p in grouped["embedding"])
    whole = torch.cat([p.detach().double().flatten() for p in matrices]).norm().item()
    assert abs(norms["all"] - whole) < 1e-6 * whole
    assert abs(sum(v * v for k, v in norms.items() if k != "all") - whole ** 2) < 1e-6 * whole ** 2
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(2.0)
    doubled = probe.matrix_norms(model)
    assert abs(doubled["embedding"] - 2 * norms["embedding"]) < 1e-6 * norms["embedding"]
    assert doubled["attention"] == norms["attention"]


def test_a_run_prints_the_base_and_each_model_s_ratio_to_it(capsys):
    probe.main([str(default_model_dir()), str(default_model_dir())])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith(f"| {default_model_dir()}")]
    assert len(rows) == 2 and "(" not in rows[0] and rows[1].count("(1.00)") == 6
