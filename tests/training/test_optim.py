"""Per-element update multipliers (clover/training/optim.py): under AdamW they are a per-element
learning rate, weight decay included."""

import torch

from clover.training.optim import scaled_updates


def test_a_scaled_update_is_adamw_at_the_scaled_learning_rate():
    torch.manual_seed(0)
    scaled, grouped = torch.nn.Linear(6, 5), torch.nn.Linear(6, 5)
    grouped.load_state_dict(scaled.state_dict())
    lr, times = 1e-2, 7.0
    by_scale = torch.optim.AdamW(scaled.parameters(), lr=lr, weight_decay=0.1)
    by_group = torch.optim.AdamW([{"params": [grouped.weight], "lr": lr * times}, {"params": [grouped.bias]}],
                                 lr=lr, weight_decay=0.1)
    scales = {scaled.weight: torch.full_like(scaled.weight, times)}
    for _ in range(20):
        x = torch.randn(4, 6)
        for model, optimizer in ((scaled, by_scale), (grouped, by_group)):
            optimizer.zero_grad()
            model(x).pow(2).sum().backward()
        with scaled_updates(scales):
            by_scale.step()
        by_group.step()
    # the group ran at 7 times the rate: a scale that never applied would fail the first check
    torch.testing.assert_close(scaled.weight, grouped.weight, rtol=0, atol=2e-6)
    torch.testing.assert_close(scaled.bias, grouped.bias, rtol=0, atol=2e-7)  # no scale: the same step
