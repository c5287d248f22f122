"""User errors end in one line and exit 2, internal errors in one line and exit 1: binary stdin, a
truncated checkpoint, an unknown device, a missing --model folder, a malformed recipe."""

import io
import shutil

import pytest

from clover.cli import common
from clover.cli.main import main
from clover.data.tokenizer import save_tokenizer, train_tokenizer
from tiny import tiny_model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "ck"
    tokenizer = train_tokenizer(["hello world, this is clover"] * 10, 300)
    tiny_model(vocab_size=len(tokenizer), mask_token_id=tokenizer.mask_token_id).save_pretrained(path)
    save_tokenizer(tokenizer, path)
    return path


def run(capsys, *argv) -> tuple[int, str]:
    code = main([*map(str, argv)])
    err = capsys.readouterr().err
    return code, err


def one_line_user_error(code: int, err: str, *words: str) -> None:
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, err


def test_binary_stdin(checkpoint, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"\x89PNG\r\n\x1a\n\xff\x00")))
    code, err = run(capsys, "generate", "-", "--model", checkpoint)
    one_line_user_error(code, err, "stdin is not UTF-8")
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"text\x00more")))
    one_line_user_error(*run(capsys, "generate", "-", "--model", checkpoint), "NUL")


def test_truncated_checkpoint(checkpoint, tmp_path, capsys):
    broken = tmp_path / "broken"
    shutil.copytree(checkpoint, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    code, err = run(capsys, "generate", "hi", "--model", broken, "--max-new-tokens", "4")
    one_line_user_error(code, err, "truncated")


@pytest.mark.parametrize("device", ["tpu9", "cuda:banana", "xla"])
def test_unknown_device(checkpoint, capsys, device):
    one_line_user_error(*run(capsys, "generate", "hi", "--model", checkpoint, "--device", device), device)


def test_missing_model_folder(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    one_line_user_error(*run(capsys, "generate", "hi", "--model", "no_such_dir"), "no such folder")
    one_line_user_error(*run(capsys, "serve", "--model", "./no/such"), "no such folder")
    code, err = run(capsys, "serve", "--model", "someone/model")  # serve reads local folders only
    one_line_user_error(code, err, "Hub repo id")
    (tmp_path / "file").write_text("x")
    one_line_user_error(*run(capsys, "generate", "hi", "--model", "file"), "is a file")


def test_hub_like_model_is_said_to_be_a_hub_id(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert common.model_path("someone/model") == "someone/model"
    assert "Hugging Face Hub repo id" in capsys.readouterr().err


def test_internal_error_is_exit_1(capsys, monkeypatch):
    def broken(args):
        raise RuntimeError("a bug\nover two lines")

    monkeypatch.setattr("clover.cli.info.run", broken)
    code, err = run(capsys, "info")
    assert code == 1 and err.strip().splitlines() == [
        "clover info: internal error: RuntimeError: a bug over two lines (set CLOVER_DEBUG=1 for the traceback)"]


def test_malformed_recipe_is_one_line(capsys, tmp_path):
    (tmp_path / "r.yaml").write_text("model: [unclosed\n  lr: 1")
    one_line_user_error(*run(capsys, "train", tmp_path / "r.yaml"))
    (tmp_path / "r.json").write_text('{"model": ')
    one_line_user_error(*run(capsys, "train", tmp_path / "r.json"))


@pytest.mark.parametrize("flag,value,limit", [("--prefill-share", "0", "(0, 1]"), ("--prefill-share", "1.5", "(0, 1]"),
                                              ("--max-step-tokens", "0", "positive"),
                                              ("--step-attention-tokens", "-1", ">= 0")])
def test_serve_refuses_bad_scheduler_settings(checkpoint, capsys, flag, value, limit):
    one_line_user_error(*run(capsys, "serve", "--model", checkpoint, flag, value), f"{flag}={value}", limit)
