"""Module-scoped fixtures of the serving tests: the test tokenizer, the tiny fp32 model, and
`one_thread` for modules that step an `Engine` on the test thread (OpenMP threads spin waiting for
each other on a small shared CPU): `pytestmark = pytest.mark.usefixtures("one_thread")`."""

import pytest
import torch

from serve_fixtures import make_model, make_tokenizer


@pytest.fixture(scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return make_model(tok)
