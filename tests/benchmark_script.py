"""Load a script from `benchmarks/` as a module, for tests of its helpers. Import as
`from benchmark_script import load_benchmark` (tests/conftest.py puts this folder on sys.path)."""

import importlib.util
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str):
    """`benchmarks/<name>.py`, executed as a fresh module named `name`."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
