"""lm-eval, a client nobody here wrote, against the server with its default settings (issues 12, 13):
it scores what `clover eval` scores on the same held-out prompts (block diffusion, greedy, chat
completions), and its multiple-choice log-likelihoods (completions with echo + logprobs) are the
model's own causal ones. A small version of `benchmarks/lm_eval/run.py`, in process."""

import sys
from pathlib import Path

import pytest

lm_eval = pytest.importorskip("lm_eval")

import clover  # noqa: E402
from clover.data import get_task  # noqa: E402
from clover.data.tasks.base import clean_output  # noqa: E402
from clover.evaluation.run import decode_one  # noqa: E402
from clover.loading import load_model_and_tokenizer  # noqa: E402
from clover.serving import EngineConfig, Runtime, ServerConfig, create_app  # noqa: E402
from serve_fixtures import ServerThread  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "lm_eval"))
import harness  # noqa: E402
import reference  # noqa: E402
import task_docs  # noqa: E402

NAME = "clover-tiny"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    model_dir = clover.default_model_dir()
    model, tok = load_model_and_tokenizer(model_dir)
    app = create_app(ServerConfig(served_model_name=NAME),
                     lambda metrics: Runtime.from_objects(model, tok, EngineConfig(num_threads=1), metrics))
    srv = ServerThread(app).start()
    generate, choice = task_docs.generate_docs(1), task_docs.choice_docs(tok, 1)
    data = task_docs.write_docs(tmp_path_factory.mktemp("lm_eval"), {"generate": generate, "choice": choice})
    yield model, tok, model_dir, srv.base_url + "/v1", data, generate, choice
    srv.stop()


def test_lm_eval_scores_what_clover_eval_scores(setup):
    model, tok, _, url, data, docs, _ = setup
    theirs = harness.generate_scores(url, NAME, data)
    ours = reference.generate_scores(model, tok, limit=1)
    assert theirs["n"] == ours["n"] == len(docs) == 3
    assert theirs["exact_match"] == ours["exact_match"] and theirs["per_task"] == ours["per_task"]
    for doc in docs:  # the very answers, not only their scores
        task = get_task(doc["task"])
        text, *_ = decode_one(model, tok, task.generate(doc["seed"], "eval"), "block_diffusion",
                              {"max_new_tokens": 512})
        assert clean_output(theirs["responses"][doc["task"]][0]) == clean_output(text)


def test_lm_eval_multiple_choice_reads_the_models_causal_loglikelihoods(setup):
    model, tok, model_dir, url, data, _, docs = setup
    theirs = harness.choice_scores(url, NAME, data, model_dir)
    ours = reference.choice_scores(model, tok, docs)
    assert theirs["n"] == ours["n"] == len(docs) >= 2
    for a, b in zip(theirs["loglikelihoods"], ours["loglikelihoods"]):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-4)
    assert theirs["acc"] == ours["acc"]
