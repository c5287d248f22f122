"""`clover generate` on a tiny saved checkpoint with its own tokenizer."""

import io

import pytest
import torch

from clover.cli.main import main
from clover.data.tokenizer import save_tokenizer, train_tokenizer
from tiny import tiny_model
from decoding_helpers import one_thread  # noqa: F401

TEXTS = ["the quick brown fox jumps over the lazy dog", "hello world, this is clover", "1 2 3 4 5"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_clover")
    tokenizer = train_tokenizer(TEXTS * 10, 300)
    model = tiny_model(vocab_size=len(tokenizer), mask_token_id=tokenizer.mask_token_id)
    with torch.no_grad():
        model.lm_head.weight.mul_(20)
    model.save_pretrained(path)
    save_tokenizer(tokenizer, path)
    return str(path)


def run_cli(capsys, *argv):
    code = main(["generate", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_streams_text_and_ends_with_statistics(checkpoint, capsys):
    code, out, err = run_cli(capsys, "hello world", "--model", checkpoint, "--max-new-tokens", "12",
                             "--block-size", "4", "--threshold", "0.9")
    assert code == 0, err
    assert out.strip()
    last = err.strip().splitlines()[-1]
    assert "tokens," in last and "forwards" in last and "tokens/forward" in last and "tokens/s" in last


def test_chat_show_denoising_plain_lines(checkpoint, capsys):
    code, out, err = run_cli(capsys, "hi", "--model", checkpoint, "--chat", "--system", "be brief",
                             "--no-thinking", "--max-new-tokens", "8", "--block-size", "4",
                             "--show-denoising", "--seed", "1", "--temperature", "0.7", "--threshold", "1.0")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("[block 0] ") and "░" in lines[0]  # first step: masks remain
    assert any(line.startswith("[commit] ") for line in lines)


@pytest.mark.parametrize("fallback, fill", [(None, None), ("causal", None), ("causal", "prefix")])
def test_show_denoising_on_a_terminal_redraws_in_place(checkpoint, fallback, fill):
    from argparse import Namespace

    from clover.cli.generate import generate_text
    from clover.loading import LoadOptions, load_model_and_tokenizer

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    model, tokenizer = load_model_and_tokenizer(checkpoint, LoadOptions(device="cpu"))
    args = Namespace(chat=False, system=None, thinking=None, block_size=4, threshold=0.9, max_new_tokens=8,
                     temperature=None, top_p=None, top_k=None, seed=None, show_denoising=True, ar=False,
                     self_spec=False, fallback=fallback, fill=fill)
    out, err = Terminal(), io.StringIO()
    assert generate_text(model, tokenizer, args, "hello", out, err) == 0
    assert "\r\x1b[K" in out.getvalue() and "░" in out.getvalue()


def test_stdin_prompt_and_ar(checkpoint, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("the quick brown"))
    code, out, err = run_cli(capsys, "-", "--model", checkpoint, "--ar", "--max-new-tokens", "5")
    assert code == 0, err
    assert "5 forwards" in err or "stop: eos" in err


def test_self_spec_prints_the_ar_text(checkpoint, capsys):
    code, ar, err = run_cli(capsys, "the quick brown", "--model", checkpoint, "--ar", "--max-new-tokens", "12")
    assert code == 0, err
    code, spec, err = run_cli(capsys, "the quick brown", "--model", checkpoint, "--self-spec",
                              "--max-new-tokens", "12")
    assert code == 0, err
    assert spec == ar
    code, _, err = run_cli(capsys, "hi", "--model", checkpoint, "--ar", "--self-spec")
    assert code == 2 and "exclusive" in err


def test_errors_are_reported(checkpoint, capsys):
    code, _, err = run_cli(capsys, "hello", "--model", checkpoint, "--block-size", "3")
    assert code == 2 and "block_size=3 is invalid" in err
    code, _, err = run_cli(capsys, "--model", str(checkpoint) + "-missing")
    assert code == 2 and "missing" in err


def test_no_prompt_runs_the_builtin_airspace_example(checkpoint, capsys):
    code, _, err = run_cli(capsys, "--model", checkpoint, "--max-new-tokens", "8")
    assert code == 0, err
    assert "built-in airspace example" in err and "NOTICE" in err
