"""generation_config.json as this project writes it loads without transformers' "generation flags are
not valid" warning (no neutral `top_k: 0` beside greedy decoding), old files included."""

import json

import pytest
from transformers import GenerationConfig
from transformers.generation import configuration_utils

from clover.model.checkpoint_io import read_generation_config
from clover.model.checkpoint_save import write_generation_config
from clover.model.generation_config import SPEC_DEFAULTS, resolve_config
from tiny import tiny_model


@pytest.fixture
def warnings_of_transformers(monkeypatch):
    seen = []
    monkeypatch.setattr(configuration_utils.logger, "warning_once", lambda message, *a: seen.append(message))
    monkeypatch.setattr(configuration_utils.logger, "warning", lambda message, *a, **k: seen.append(message))
    return seen


def test_written_defaults_leave_out_the_neutral_top_k(tmp_path):
    write_generation_config(tmp_path, {**SPEC_DEFAULTS, "eos_token_id": [2]})
    written = json.loads((tmp_path / "generation_config.json").read_text())
    assert "top_k" not in written and written["do_sample"] is False and written["eos_token_id"] == [2]
    write_generation_config(tmp_path, {"top_k": 40})  # merged over the file; a real top_k is kept
    written = json.loads((tmp_path / "generation_config.json").read_text())
    assert written["top_k"] == 40 and written["threshold"] == SPEC_DEFAULTS["threshold"]


def test_saved_checkpoint_loads_without_generation_flag_warnings(tmp_path, warnings_of_transformers):
    model = tiny_model()
    model.generation_config = GenerationConfig(**SPEC_DEFAULTS)  # warns here, once: top_k 0 beside greedy
    model.save_pretrained(tmp_path)
    warnings_of_transformers.clear()
    loaded = type(model).from_pretrained(tmp_path)
    assert not any("generation flags" in m for m in warnings_of_transformers), warnings_of_transformers
    assert resolve_config(loaded.generation_config, loaded.config, {}).top_k == 0


def test_an_older_file_with_top_k_zero_loads_without_the_warning(tmp_path, warnings_of_transformers):
    (tmp_path / "generation_config.json").write_text(json.dumps({**SPEC_DEFAULTS, "top_k": 0}))
    config = read_generation_config(tmp_path)
    assert not any("generation flags" in m for m in warnings_of_transformers), warnings_of_transformers
    assert config.do_sample is False and resolve_config(config, None, {}).top_k == 0
    GenerationConfig.from_pretrained(tmp_path)  # what transformers alone does: the warning this avoids
    assert any("generation flags" in m for m in warnings_of_transformers)
