"""Shared test setup: makes `tests/` importable by bare name (`from tiny import tiny_model`)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tiny import tiny_model  # noqa: E402


@pytest.fixture
def model():
    return tiny_model()
