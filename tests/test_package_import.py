"""`import clover` is light (the CLI's help needs neither torch nor transformers) and still registers
`clover_moe` with the Auto classes on first use, whichever of clover / transformers comes first."""

import os
import subprocess
import sys
from pathlib import Path

import clover

ROOT = Path(__file__).resolve().parents[1]

HELP_EVERY_COMMAND = """
import sys
from clover.cli.main import COMMANDS, build_parser

parser = build_parser()
for argv in [["--help"]] + [[name, "--help"] for name in COMMANDS]:
    try:
        parser.parse_args(argv)
    except SystemExit as e:
        assert e.code == 0, argv
heavy = sorted(m for m in ("torch", "transformers", "numpy", "clover.model") if m in sys.modules)
print("heavy modules:", heavy)
"""


def run_python(script: str) -> str:
    env = os.environ | {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_cli_help_imports_neither_torch_nor_transformers():
    out = run_python(HELP_EVERY_COMMAND)
    assert "heavy modules: []" in out, out
    assert "usage: clover" in out


def test_auto_classes_know_clover_when_clover_is_imported_first():
    model_dir = str(clover.default_model_dir())
    out = run_python(f"""
import sys
import clover
assert "transformers" not in sys.modules and "torch" not in sys.modules
from transformers import AutoConfig, AutoModelForCausalLM
config = AutoConfig.from_pretrained({model_dir!r})
model = AutoModelForCausalLM.from_config(config)
print(type(config).__module__, type(model).__module__)
""")
    assert out.split() == ["clover.model.configuration_clover_moe", "clover.model.modeling_clover_moe"]


def test_auto_classes_know_clover_when_transformers_is_imported_first():
    model_dir = str(clover.default_model_dir())
    out = run_python(f"""
from transformers import AutoModelForCausalLM
import clover
model = AutoModelForCausalLM.from_pretrained({model_dir!r})
print(type(model).__module__)
""")
    assert out.split() == ["clover.model.modeling_clover_moe"]


def test_model_classes_are_available_from_the_package():
    from transformers import AutoConfig

    from clover import CloverMoeConfig, CloverMoeForCausalLM
    from clover.model import modeling_clover_moe

    assert CloverMoeForCausalLM is modeling_clover_moe.CloverMoeForCausalLM
    assert isinstance(AutoConfig.for_model("clover_moe"), CloverMoeConfig)
