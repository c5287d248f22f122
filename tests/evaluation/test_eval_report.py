"""`clover eval` mechanics on a tiny random model: counts, JSON fields, progress, CLI."""

import json

import pytest

from clover.data import eval_examples, get_task, save_tokenizer
from clover.evaluation.run import DecodeSummary, EvalReport, evaluate, report_lines


def test_evaluate_counts_both_modes(model, tokenizer):
    examples = eval_examples(2, seed=0, tasks=[get_task("joint"), get_task("record")])
    report = evaluate(model, tokenizer, examples, model_name="tiny", max_new_tokens=16,
                      block_size=8, threshold=0.9, show_progress=False)
    d, a = report.diffusion, report.ar
    assert d.n == a.n == 4 and set(d.per_task) == {"joint", "record"}
    assert 0 < d.new_tokens <= 4 * 16 and d.forwards >= d.new_tokens / 8
    assert a.forwards >= a.new_tokens - 4  # AR: one token per forward (the first from the prefill)
    out = report.to_json()
    for key in ("model", "task", "n", "accuracy", "tokens_per_forward", "tokens_per_second",
                "ar_accuracy", "ar_tokens_per_second"):
        assert key in out
    assert out["thinking"] is True and "thinking on" in report_lines(report)[0]  # the template's default
    off = evaluate(model, tokenizer, examples[:1], max_new_tokens=4, block_size=8, show_progress=False,
                   enable_thinking=False, with_ar=False)
    assert off.thinking is False and "thinking off" in report_lines(off)[0]
    json.dumps(out)
    assert any("block diffusion / AR" in line for line in report_lines(report))


def test_ar_only_eval_decodes_ar_alone(model, tokenizer, tmp_path, capsys):
    """`with_diffusion=False` (`--no-block-diffusion`) decodes AR alone, with the texts AR writes
    beside block diffusion; the report and its JSON hold AR's figures only. Dropping every mode is
    refused."""
    from clover.cli.main import main

    examples = eval_examples(1, seed=0, tasks=[get_task("joint"), get_task("record")])
    both = evaluate(model, tokenizer, examples, max_new_tokens=8, block_size=8, show_progress=False)
    alone = evaluate(model, tokenizer, examples, max_new_tokens=8, block_size=8, show_progress=False,
                     with_diffusion=False)
    assert alone.diffusion is None and alone.ar.texts == both.ar.texts and alone.paired_with_ar is None
    out = alone.to_json()
    assert out["n"] == 2 and out["ar_accuracy"] == both.ar.accuracy and "accuracy" not in out
    lines = report_lines(alone)
    assert not any(line.startswith("block_diffusion") for line in lines)
    assert lines[2].startswith("ar ") and lines[3].split() == ["task", "/", "field", "AR"]
    with pytest.raises(ValueError, match="no mode to decode"):
        evaluate(model, tokenizer, examples, with_diffusion=False, with_ar=False, show_progress=False)
    model.save_pretrained(tmp_path / "m")
    save_tokenizer(tokenizer, tmp_path / "m")
    args = ["eval", "--model", str(tmp_path / "m"), "--task", "record", "--limit", "1", "--max-new-tokens", "4",
            "--no-block-diffusion", "--json"]
    assert main(args) == 0
    assert "ar_accuracy" in json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main(args + ["--no-ar"]) == 2
    assert "leaves no mode to decode" in capsys.readouterr().err


def test_self_spec_writes_ar_text_on_every_prompt(model, tokenizer):
    """C6 through `clover eval`: self-speculative decoding's outputs equal AR's, prompt by prompt,
    and the report says so; a changed output would be counted."""
    examples = eval_examples(2, seed=0, tasks=[get_task("joint"), get_task("record")])
    report = evaluate(model, tokenizer, examples, max_new_tokens=16, block_size=8, threshold=0.9,
                      show_progress=False, with_self_spec=True)
    s, a = report.self_spec, report.ar
    assert s.n == 4 and s.texts == a.texts and all(a.texts) and s.correct == a.correct
    assert report.self_spec_same_as_ar == 4 and report.to_json()["self_spec_same_as_ar"] == 4
    assert any("text equal to AR's on 4/4" in line for line in report_lines(report))
    s.texts[0] += "x"
    assert report.self_spec_same_as_ar == 3


def test_batched_eval_writes_the_texts_of_batch_one(model, tokenizer):
    """`batch_size` decodes several prompts (of unequal lengths) per call; rows are independent, so
    every mode writes what it writes at batch one, each row counting its own tokens and forwards."""
    examples = eval_examples(3, seed=0, tasks=[get_task("joint"), get_task("record")])
    settings = dict(max_new_tokens=16, block_size=8, threshold=0.9, show_progress=False, with_self_spec=True)
    one = evaluate(model, tokenizer, examples, **settings)
    four = evaluate(model, tokenizer, examples, batch_size=4, **settings)
    for alone, batched in ((one.diffusion, four.diffusion), (one.ar, four.ar), (one.self_spec, four.self_spec)):
        assert batched.texts == alone.texts and all(alone.texts)
        assert (batched.outcomes, batched.new_tokens, batched.forwards) == (alone.outcomes, alone.new_tokens,
                                                                            alone.forwards)
    assert four.batch_size == 4 and four.to_json()["batch_size"] == 4 and one.to_json()["batch_size"] == 1
    assert "batch 4  (modes interleaved per batch)" in report_lines(four)[0]
    with pytest.raises(ValueError, match="batch_size=0 must be at least 1"):
        evaluate(model, tokenizer, examples, batch_size=0, **settings)


def test_eval_cli_json_last_line(model, tokenizer, tmp_path, capsys):
    from clover.cli.main import main

    model.save_pretrained(tmp_path / "m")
    save_tokenizer(tokenizer, tmp_path / "m")
    assert main(["eval", "--model", str(tmp_path / "m"), "--task", "joint", "--limit", "2",
                 "--max-new-tokens", "8", "--json"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last)["n"] == 2


def test_eval_cli_pools_several_seeds(model, tokenizer, tmp_path, capsys):
    """`--seed 0 3` decodes both seeds' prompts into one report; a repeated seed is refused."""
    from clover.cli.main import main

    model.save_pretrained(tmp_path / "m")
    save_tokenizer(tokenizer, tmp_path / "m")
    args = ["eval", "--model", str(tmp_path / "m"), "--task", "record", "--limit", "1", "--max-new-tokens", "4",
            "--no-ar", "--json", "--seed"]
    assert main(args + ["0", "3"]) == 0
    out = capsys.readouterr().out
    result = json.loads(out.strip().splitlines()[-1])
    assert result["n"] == 2 and result["seeds"] == [0, 3]  # one prompt from each seed
    assert "seeds 0 3: 1 prompts per task each" in out
    assert main(args + ["3", "3"]) == 2
    assert "--seed 3 3 repeats a seed" in capsys.readouterr().err


def test_eval_cli_refuses_unknown_task(capsys):
    from clover.cli.main import main

    assert main(["eval", "--task", "nope"]) == 2
    assert "nope" in capsys.readouterr().err
    assert main(["eval", "--task", "record", "--batch-size", "0"]) == 2
    assert "--batch-size=0 must be positive" in capsys.readouterr().err


def test_evaluate_reports_per_field_counts(model, tokenizer):
    examples = eval_examples(1, seed=0, tasks=[get_task("airspace"), get_task("record")])
    report = evaluate(model, tokenizer, examples, max_new_tokens=8, block_size=8, threshold=0.9,
                      show_progress=False)
    for summary in (report.diffusion, report.ar):
        assert set(summary.per_field["record"]) == set(examples[1].meta["fields"])
        assert summary.per_field["airspace"]["id"][1] == len(examples[0].meta["zones"])
    assert report.to_json()["threads"] >= 1


def test_field_losses_label_every_answer_token(model, tokenizer):
    from clover.data import format_chat
    from clover.evaluation.field_loss import field_losses, token_fields

    example = get_task("record").generate(0, "eval")
    chat = format_chat(tokenizer, example, enable_thinking=True)
    enc = tokenizer(chat.answer, add_special_tokens=False, return_offsets_mapping=True)
    fields = token_fields(get_task("record"), example, chat.answer, enc["offset_mapping"])
    assert len(fields) == len(enc.input_ids) and "template" in fields and "pilot" in fields
    pilot = "".join(tokenizer.decode([t]) for t, f in zip(enc.input_ids, fields) if f == "pilot")
    assert pilot.strip() == example.meta["fields"]["pilot"]
    losses = field_losses(model, tokenizer, [example], block_size=8, enable_thinking=True)
    counted = sum(m["tokens"] for m in losses["record"].values())
    assert counted == len(enc.input_ids)
    assert all(m["ar"] > 0 and m["diff"] > 0 for m in losses["record"].values())


def test_field_losses_label_the_think_block_as_reasoning(tokenizer):
    """In thinking mode a joint answer's think block is its own field; the yes/no fields are the
    answer line's, never the same words inside the reasoning."""
    from clover.data import format_chat
    from clover.evaluation.field_loss import token_fields

    task = get_task("joint")
    example = task.generate(1, "eval")
    chat = format_chat(tokenizer, example, enable_thinking=True)
    enc = tokenizer(chat.answer, add_special_tokens=False, return_offsets_mapping=True)
    fields = token_fields(task, example, chat.answer, enc["offset_mapping"])
    spans = [span for span, f in zip(enc["offset_mapping"], fields) if f == "reasoning"]
    start = chat.answer.index(example.reasoning)
    assert spans[0][0] == start and spans[-1][1] == start + len(example.reasoning)
    answer_start = next(i for i, f in enumerate(fields) if f in ("fact", "derived"))
    assert all(f != "reasoning" for f in fields[answer_start:])
    yes_no = [span for span, f in zip(enc["offset_mapping"], fields) if f in ("fact", "derived")]
    assert yes_no[0][0] >= chat.answer.rindex(example.answer)


def test_paired_comparison_counts_the_prompts_on_which_the_modes_disagree():
    diffusion, ar = DecodeSummary("block_diffusion"), DecodeSummary("ar")
    for d, a in [(True, True), (True, False), (False, True), (False, True), (False, False)]:
        diffusion.add("joint", {"correct": d}, 4, 1, 0.1)
        ar.add("joint", {"correct": a}, 4, 4, 0.4)
    report = EvalReport("m", "joint", 0.95, 32, 1, diffusion, ar)
    only_d, only_a, se = report.paired_with_ar
    assert (only_d, only_a) == (1, 2)
    assert se == pytest.approx((3 - 1 / 5) ** 0.5 / 5)  # sqrt(b + c - (b - c)^2 / n) / n
    assert report.to_json()["only_ar_correct"] == 2
    assert any("-0.200" in line and "wrong where AR is right on 2" in line for line in report_lines(report))
    assert EvalReport("m", "joint", 0.95, 32, 1, diffusion, None).paired_with_ar is None


def test_eval_cli_task_options_change_the_prompts(model, tokenizer, tmp_path, capsys):
    """`--option TASK.NAME=JSON` builds that task with the option; the JSON records the options. A
    malformed pair, a task not evaluated or an option the task does not take is refused by name."""
    from clover.cli.main import main

    model.save_pretrained(tmp_path / "m")
    save_tokenizer(tokenizer, tmp_path / "m")
    args = ["eval", "--model", str(tmp_path / "m"), "--task", "joint", "--limit", "1", "--max-new-tokens", "4",
            "--no-ar", "--json"]
    assert main(args + ["--option", 'joint.facts="roster"', "--option", "joint.max_questions=3"]) == 0
    out = capsys.readouterr().out
    given = {"joint": {"facts": "roster", "max_questions": 3}}
    assert json.loads(out.strip().splitlines()[-1])["task_options"] == given
    assert 'task options: {"joint": {"facts": "roster", "max_questions": 3}}' in out
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["task_options"] == {}
    for pair, message in [("joint.facts=roster", "expected NAME=JSON"),
                          ("record.max_questions=3", "TASK one of the evaluated tasks ['joint']"),
                          ("facts=1", "TASK one of the evaluated tasks"),
                          ("joint.colour=1", "unexpected keyword argument 'colour'"),
                          ('joint.facts="table"', "facts='table' must be one of")]:
        assert main(args + ["--option", pair]) == 2, pair
        assert message in capsys.readouterr().err, pair
