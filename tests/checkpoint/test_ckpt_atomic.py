"""A save or conversion that fails midway leaves the destination as it was and no temporary dir."""

import pytest

import clover.model.checkpoint_save as checkpoint_save
from ckpt_helpers import hf_model, save_hf
from clover.checkpoint import convert_checkpoint
from tiny import tiny_model


def fail_on_call(monkeypatch, n: int):
    """Make the n-th safetensors write (1-based) write its file, then raise."""
    real = checkpoint_save.save_file
    calls = []

    def save_file(tensors, path, metadata=None):
        calls.append(path)
        real(tensors, path, metadata=metadata)
        if len(calls) == n:
            raise OSError("disk full (simulated)")

    monkeypatch.setattr(checkpoint_save, "save_file", save_file)


def snapshot(path):
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def test_failed_save_leaves_no_checkpoint(tmp_path, monkeypatch):
    fail_on_call(monkeypatch, 2)
    with pytest.raises(OSError, match="simulated"):
        tiny_model().save_pretrained(tmp_path / "ck", max_shard_size="40KB")
    assert list(tmp_path.iterdir()) == []


def test_failed_save_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    tiny_model(seed=1).save_pretrained(tmp_path / "ck")
    before = snapshot(tmp_path / "ck")
    fail_on_call(monkeypatch, 3)
    with pytest.raises(OSError, match="simulated"):
        tiny_model(seed=2).save_pretrained(tmp_path / "ck", experts="per_expert", max_shard_size="40KB")
    assert snapshot(tmp_path / "ck") == before
    assert [p.name for p in tmp_path.iterdir()] == ["ck"]


def test_failed_conversion_leaves_no_output(tmp_path, monkeypatch):
    save_hf(hf_model(), tmp_path / "hf")
    fail_on_call(monkeypatch, 1)
    with pytest.raises(OSError, match="simulated"):
        convert_checkpoint(tmp_path / "hf", tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_interrupt_is_also_cleaned_up(tmp_path, monkeypatch):
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint_save, "copy_model_code", interrupt)
    monkeypatch.setattr("clover.model.checkpoint_io.copy_model_code", interrupt)
    with pytest.raises(KeyboardInterrupt):
        tiny_model().save_pretrained(tmp_path / "ck")
    assert list(tmp_path.iterdir()) == []
