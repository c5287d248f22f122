"""Line-owner supervision (clover/training/line_owner.py): which pilot's fact line a token is in,
and the residual stream read off the training forwards."""

import pytest
import torch

from clover.training.data import Pair, collate
from clover.training.line_owner import (AskedTokens, OwnerTokens, RecordedResiduals, RuleFirstTokens, asked_owners,
                                        batch_owners, joint_asked_tokens, joint_owner_tokens, joint_rule_first_tokens,
                                        line_owner_loss, line_owners, rule_first_owners)
from clover.training.loss import JointLoss, causal_logits
from clover.training.noising import noise_generator, sample_block_noise
from clover.training.trainer import TrainConfig
from tiny import tiny_model

EOS, PAD = 1, 0
# names 40 (class 0) and 41 (class 1); 9 the space; 20 "is", 21 "has"; 30 and 31 full stops
TOKENS = OwnerTokens(names=(40, 41), verbs=frozenset((20, 21)), space=9, stops=frozenset((30, 31)))


def test_a_line_is_owned_from_after_its_name_to_its_full_stop():
    #      Is    Ana   cert?  Ana   _  is  _  a  _  b  .\n  Ben  _  has _  n  .   _  yes
    ids = [50, 9, 40, 9, 60, 70, 9, 40, 9, 20, 9, 61, 9, 62, 31, 41, 9, 21, 9, 63, 30, 9, 80]
    owners = line_owners(ids, TOKENS)
    assert owners[:8] == [-1] * 8  # the question's name is followed by a property, not `is`: no line
    assert owners[8:15] == [0] * 7  # Ana's line, its space and `is` through `.\n`
    assert owners[15] == -1 and owners[16:21] == [1] * 5  # Ben's name is not owned, his line is
    assert owners[21:] == [-1, -1]  # after the full stop
    assert line_owners([40, 9, 20, 9, 61], TOKENS) == [-1, 0, 0, 0, 0]  # a line cut off stays owned to the end
    assert line_owners([40, 9], TOKENS) == [-1, -1]


def test_joint_s_owner_tokens_are_single_tokens_of_the_embedded_tokenizer():
    from clover import default_model_dir
    from clover.data.tasks.vocab import FIRST_NAMES
    from clover.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(default_model_dir())
    tokens = joint_owner_tokens(tokenizer)
    assert [tokenizer.decode([t]) for t in tokens.names] == list(FIRST_NAMES)
    text = "Facts (nothing else is true):\nHal is insured.\nQuestions:\n1. Is Hal insured? Hal is insured. yes"
    ids = tokenizer(text, add_special_tokens=False).input_ids
    owned = [tokenizer.decode([t]) for t, c in zip(ids, line_owners(ids, tokens)) if c >= 0]
    assert "".join(owned) == " is insured.\n" + " is insured."
    assert {c for c in line_owners(ids, tokens) if c >= 0} == {FIRST_NAMES.index("Hal")}


def test_a_derivation_line_is_owned_by_its_asked_property_after_the_question():
    asked = AskedTokens(properties=(60, 61), ask=90, newlines=frozenset((91, 92)))
    #      Is  _  Ana _ p60 ?   _  Ana _  is  .   _  yes \n  Is  _ p61 ?\n  Is  _ p61 ?
    ids = [50, 9, 40, 9, 60, 90, 9, 40, 9, 20, 30, 9, 80, 91, 50, 9, 61, 92, 50, 9, 61, 90, 9, 62]
    owners = asked_owners(ids, asked)
    assert owners[:6] == [-1] * 6  # the question itself, its `?` included
    assert owners[6:13] == [0] * 7  # the line after the question, its verdict included
    assert owners[13:21] == [-1] * 8  # the newline ends it; a `?` glued to a newline (the prompt's) owns nothing
    assert owners[21] == -1 and owners[22:] == [1, 1]  # the next line, cut off, stays owned to the end
    assert asked_owners([20, 90, 9], asked) == [-1, -1, -1]  # `?` after a word that is no property


def test_joint_s_asked_tokens_own_the_derivation_lines_after_their_questions():
    from clover import default_model_dir
    from clover.data import eval_examples, get_task
    from clover.data.tasks.joint import BASE, DERIVED
    from clover.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(default_model_dir())
    tokens = joint_asked_tokens(tokenizer)
    properties = (*BASE, *DERIVED)
    assert [tokenizer.decode([t]) for t in tokens.classes] == list(properties)
    for example in eval_examples(8, seed=0, tasks=[get_task("joint")]):
        prompt = tokenizer(example.prompt, add_special_tokens=False).input_ids
        assert set(asked_owners(prompt, tokens)) == {-1}  # the prompt's questions end in `?\n`
        ids = tokenizer(example.reasoning, add_special_tokens=False).input_ids
        owners = asked_owners(ids, tokens)
        runs = []  # (owned text, its class) of each run of owned tokens
        for j, (t, c) in enumerate(zip(ids, owners)):
            if c >= 0 and (j == 0 or owners[j - 1] != c):
                runs.append(("", c))
            if c >= 0:
                runs[-1] = (runs[-1][0] + tokenizer.decode([t]), c)
        lines = example.reasoning.split("\n")
        assert [text for text, _ in runs] == [line.split("?", 1)[1] for line in lines]
        assert [properties[c] for _, c in runs] == [line.split("?")[0].rsplit(" ", 1)[-1] for line in lines]


def test_a_rule_sentence_s_property_word_owns_its_first_condition():
    rules = RuleFirstTokens(properties=(40, 41, 42, 90, 91), opener=70, stops=frozenset({21, 22}))
    # "Anyone 50 41 60 40 50 91 ." "Anyone 50 40 50 92 ." (92 no property) "Anyone 50 90 50 91 .\n" "Anyone 40"
    ids = [70, 50, 41, 60, 40, 50, 91, 21, 70, 50, 40, 50, 92, 21, 70, 50, 90, 50, 91, 22, 70, 40]
    owners = rule_first_owners(ids, rules)
    # the first sentence's 91 (6) owns its first condition 41 (class 1); the third's 91 (18) owns 90 (3)
    assert owners == [-1] * 6 + [1] + [-1] * 11 + [3] + [-1] * 3


def test_joint_s_rule_property_words_own_their_first_conditions():
    from clover import default_model_dir
    from clover.data import eval_examples, get_task
    from clover.data.tasks.joint import BASE, DERIVED
    from clover.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(default_model_dir())
    tokens, found = joint_rule_first_tokens(tokenizer), 0
    assert [tokenizer.decode([t]) for t in tokens.classes] == [*BASE, *DERIVED]
    for example in eval_examples(8, seed=0, tasks=[get_task("joint")]):
        for text in (example.prompt, example.reasoning):
            ids = tokenizer(text, add_special_tokens=False).input_ids
            owned = [(tokenizer.decode([t]), (*BASE, *DERIVED)[c]) for t, c in zip(ids, rule_first_owners(ids, tokens))
                     if c >= 0]
            rules = [rule.split(".")[0].split(" ") for rule in text.split("Anyone who is ")[1:]]
            found += len(rules)
            assert owned == [(rule[-1], rule[0]) for rule in rules]
    assert found


def test_a_tokenizer_that_splits_a_name_is_refused_with_the_name():
    from clover.training.copy_attention import single_tokens

    class Letters:  # writes every character as its own token
        def __call__(self, text, add_special_tokens=False):
            return type("Encoded", (), {"input_ids": [ord(c) for c in text]})()

    with pytest.raises(ValueError, match=r"line-owner supervision needs each of \['Ana', 'Ben'"):
        joint_owner_tokens(Letters())
    assert single_tokens(Letters(), (".", " "), "x") == {".": 46, " ": 32}


def test_padding_and_untargeted_tokens_are_owned_by_no_one():
    short = Pair((40, 9, 20, 9, 61, 30), (41, 9, 21, 9, 62, 31, EOS))
    long = Pair((5, 5, 5, 40, 9, 20, 9, 61, 30), (7, EOS))
    batch = collate([short, long], block_size=4, eos_id=EOS, pad_id=PAD, eos_ids=(EOS,))
    owners = batch_owners(batch, TOKENS)
    p = batch.prompt_ids.shape[1]
    assert owners[0, :3].tolist() == [-1] * 3  # the short prompt's left padding
    assert owners[0, 3:p].tolist() == [-1, 0, 0, 0, 0, 0]
    assert owners[0, p:p + 7].tolist() == [-1, 1, 1, 1, 1, 1, -1]
    assert (owners[:, p:][~batch.target_mask] == -1).all()


def test_the_fused_training_forwards_record_the_residuals_one_causal_forward_gives():
    # training matches inference: the clean rows of the fused block forwards are the causal stream's
    model = tiny_model()
    pairs = [Pair((40, 9, 20, 9, 61, 30, 12), (40, 9, 20, 9, 61, 30, 13, 14, 15, EOS)), Pair((11, 12), (41, 9, 21, 9, 62, 31, EOS))]
    batch = collate(pairs, block_size=4, eos_id=EOS, pad_id=PAD, eos_ids=(EOS,))
    noise = sample_block_noise(batch.target_mask, 4, 0.5, noise_generator(0, 0))
    loss = JointLoss(model, 4, alpha=1.0, owner_loss=0.5, owner_layer=1, owner_tokens=TOKENS)
    ridge = JointLoss(model, 4, alpha=1.0, owner_loss=0.5, owner_layer=1, owner_tokens=TOKENS, owner_readout="ridge")
    with torch.no_grad():
        fused, fused_ridge = loss(batch, noise), ridge(batch, noise)
        with RecordedResiduals(model, 1) as recorded:
            causal_logits(model, batch)
        assert len(recorded) == 1
        owners, names = batch_owners(batch, TOKENS), model.get_input_embeddings().weight[[40, 41]]
        causal = line_owner_loss(recorded[0], owners, names)
        causal_ridge = line_owner_loss(recorded[0], owners, names, "ridge")
        plain = JointLoss(model, 4, alpha=1.0)(batch, noise)
    assert torch.allclose(fused.l_owner, causal, atol=1e-5)
    assert causal_ridge > 0 and torch.allclose(fused_ridge.l_owner, causal_ridge, atol=1e-4)
    assert torch.allclose(fused.total, plain.total + 0.5 * fused.l_owner, atol=1e-6)
    asked = AskedTokens(properties=(61, 62), ask=30, newlines=frozenset((15,)))  # 30 after 61: a question
    with torch.no_grad():
        fused_asked = JointLoss(model, 4, alpha=1.0, owner_loss=0.5, owner_layer=1, owner_tokens=asked)(batch, noise)
        owned = batch_owners(batch, asked)
        causal_asked = line_owner_loss(recorded[0], owned, model.get_input_embeddings().weight[[61, 62]])
    # the first row's 12 and, its line running on with no newline, the response's 40 9 20 9 61, then 13 14
    assert (owned >= 0).sum(1).tolist() == [1 + 5 + 2, 0]
    assert causal_asked > 0 and torch.allclose(fused_asked.l_owner, causal_asked, atol=1e-5)
    with torch.no_grad():  # two targets: a loss each at the one layer, summed, times the one weight
        both = JointLoss(model, 4, alpha=1.0, owner_loss=0.5, owner_layer=1, owner_tokens=(TOKENS, asked))(batch, noise)
    assert torch.allclose(both.l_owner, causal + causal_asked, atol=1e-5)
    assert torch.allclose(both.total, plain.total + 0.5 * (causal + causal_asked), atol=1e-5)


def test_the_loss_falls_as_the_residual_turns_to_the_line_s_pilot():
    names = torch.randn(2, 8)
    owners = torch.tensor([[0, 1, -1]])
    toward = torch.stack([names[0], names[1], names[0]])[None]  # [1, 3, 8]
    away = torch.stack([names[1], names[0], names[1]])[None]
    assert line_owner_loss(toward, owners, names) < 0.01 < 10 < line_owner_loss(away, owners, names)
    assert line_owner_loss(toward, torch.full((1, 3), -1), names).item() == 0.0


def test_the_ridge_readout_falls_as_the_residual_comes_to_hold_the_pilot():
    torch.manual_seed(0)
    owners = torch.randint(0, 16, (12, 25))  # 12 rows of 25 owned tokens, 16 pilots
    noise, centers = torch.randn(12, 25, 64), torch.randn(16, 64)
    losses = [line_owner_loss(noise + a * centers[owners], owners, centers, "ridge").item() for a in (0, 0.3, 2)]
    assert losses[0] > 0.9 > losses[1] > 0.5 > 0.2 > losses[2]  # chance is 1 - 1/16 for a fit that holds nothing
    only_even = owners.clone()
    only_even[1::2] = -1  # one half of the batch owns nothing: nothing to fit on
    assert line_owner_loss(noise, only_even, centers, "ridge").item() == 0.0
    with pytest.raises(ValueError, match="owner readout 'probe' must be one of"):
        line_owner_loss(noise, owners, centers, "probe")


def test_bad_owner_settings_are_refused_by_name():
    from clover.training.trainer import Trainer
    from tests.training.conftest import digits_dataset, digits_model

    with pytest.raises(ValueError, match="owner_loss=-0.1 must be >= 0"):
        TrainConfig(steps=1, batch_size=1, block_size=4, owner_loss=-0.1)
    with pytest.raises(ValueError, match="owner_readout='probe' must be one of"):
        TrainConfig(steps=1, batch_size=1, block_size=4, owner_readout="probe")
    with pytest.raises(ValueError, match=r"owner_target='name' must be one of \('pilot', 'asked', 'rule_first'\)"):
        TrainConfig(steps=1, batch_size=1, block_size=4, owner_target="name")
    for bad in (("pilot", "name"), ("pilot", "pilot"), ()):
        with pytest.raises(ValueError, match=r"must be one of \('pilot', 'asked', 'rule_first'\), or several of them, "
                                             "each once"):
            TrainConfig(steps=1, batch_size=1, block_size=4, owner_target=bad)
    assert TrainConfig(steps=1, batch_size=1, block_size=4, owner_target=("rule_first", "pilot")).owner_targets \
        == ("rule_first", "pilot")
    assert TrainConfig(steps=1, batch_size=1, block_size=4).owner_targets == ("pilot",)
    with pytest.raises(ValueError, match="owner_loss needs the fact lines' token ids"):
        JointLoss(tiny_model(), 4, 1.0, owner_loss=0.1, owner_tokens=())
    with pytest.raises(ValueError, match="owner_layer=9 is not one of the model's 4 decoder layers"):
        JointLoss(tiny_model(), 4, 1.0, owner_loss=0.1, owner_layer=9, owner_tokens=TOKENS)
    config = TrainConfig(steps=1, batch_size=4, block_size=4, owner_loss=0.1)
    with pytest.raises(ValueError, match="owner_loss needs the fact lines' token ids"):
        Trainer(digits_model(seed=1), config, digits_dataset(4), progress=False)
    digits = OwnerTokens(names=(10, 11), verbs=frozenset((12,)), space=13, stops=frozenset((14,)))  # a 16-token vocab
    trainer = Trainer(digits_model(seed=1), config, digits_dataset(4), progress=False, owner_tokens=digits)
    assert trainer.train_step().l_owner == 0.0  # digits hold no fact line
