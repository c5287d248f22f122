"""`benchmarks/error_likelihood.py`: the likelihoods it compares are the causal mode's, token by token."""

import torch

from clover.data import eval_examples, get_task
from benchmark_script import load_benchmark

probe = load_benchmark("error_likelihood")


def _next_probs(model, ids: list[int]) -> torch.Tensor:
    return model(torch.tensor([ids])).logits[0, -1].float().softmax(-1)


@torch.inference_mode()
def test_sequence_logprob_is_each_next_token_probability(model):
    prompt, response = [5, 9, 14, 3], [20, 7, 11]
    expected = [float(_next_probs(model, prompt + response[:k])[response[k]].log()) for k in range(3)]
    got = probe.sequence_logprob(model, prompt, response)
    torch.testing.assert_close(got, torch.tensor(expected), rtol=0, atol=1e-5)


@torch.inference_mode()
def test_first_divergence_reads_the_decision_at_the_first_differing_token(model):
    prompt, target = [5, 9, 14, 3], [20, 7, 11, 12]
    probs = _next_probs(model, prompt + target[:2])
    other = int(probs.argmax()) if int(probs.argmax()) != target[2] else int(probs.argsort()[-2])
    row = probe.first_divergence(probe.next_token_logprobs(model, prompt, target), target[:2] + [other, 4], target)
    assert row["at"] == 2
    assert abs(row["p_greedy"] - float(probs[other])) < 1e-5 and abs(row["p_target"] - float(probs[target[2]])) < 1e-5
    assert row["rank"] == int((probs > probs[target[2]]).sum()) + 1


@torch.inference_mode()
def test_a_wrong_greedy_answer_left_the_target_at_its_own_argmax(model, tokenizer):
    """Greedy decoding and the teacher-forced pass agree: where greedy first leaves the target, its
    token is the most likely one, so the target ranks second or lower."""
    examples = eval_examples(2, seed=0, tasks=[get_task("joint")])
    rows = probe.wrong_answers(model, tokenizer, examples)
    assert rows, "a random model answers joint wrong"
    for row in rows:
        assert row["rank"] >= 2 and row["p_greedy"] >= row["p_target"]
    assert probe.summary(rows, 2)[0].startswith(f"{len(rows)} of 2 greedy AR answers wrong")
