"""`clover serve --model DIR` as a subprocess: loads a saved checkpoint, answers the `openai`
client on a free loopback port, logs one line per request, and stops cleanly."""

import subprocess
import sys
import time

import openai
import pytest

from clover.cli.main import build_parser
from clover.data.tokenizer import save_tokenizer
from serve_fixtures import free_port, make_model, make_tokenizer, wait_ready


def test_serve_arguments():
    args = build_parser().parse_args(["serve", "--model", "m", "--port", "9", "--max-batch-size", "4"])
    assert (args.host, args.port, args.max_batch_size, args.model) == ("127.0.0.1", 9, 4, "m")
    assert args.run.__module__ == "clover.cli.serve"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "tiny-served"
    tok = make_tokenizer()
    make_model(tok).save_pretrained(path)
    save_tokenizer(tok, path)
    return path


def test_clover_serve_subprocess(checkpoint):
    port = free_port()
    cmd = [sys.executable, "-m", "clover.cli.main", "serve", "--model", str(checkpoint), "--port", str(port),
           "--api-key", "k", "--threads", "1", "--dtype", "float32", "--device", "cpu"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        client = openai.OpenAI(api_key="k", base_url=f"http://127.0.0.1:{port}/v1", max_retries=0, timeout=30)
        deadline = time.time() + 90
        while True:
            try:
                wait_ready(client, timeout=90)
                break
            except openai.APIConnectionError:
                assert proc.poll() is None and time.time() < deadline, "server did not come up"
                time.sleep(0.2)
        assert [m.id for m in client.models.list().data] == ["tiny-served"]
        r = client.chat.completions.create(model="tiny-served", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=4)
        assert r.usage.completion_tokens > 0
    finally:
        proc.terminate()  # SIGTERM: drain, then a clean exit
        out, _ = proc.communicate(timeout=60)
    assert f"{r.id} chat prompt_tokens=" in out and "forwards=" in out
    assert proc.returncode == 0, out


def test_serve_bad_model_folder_is_one_line(checkpoint, tmp_path):
    """A folder whose weights cannot be read: the server stops with one error line, no traceback."""
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in checkpoint.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    (broken / "model.safetensors").write_bytes(b"\x00" * 64)
    cmd = [sys.executable, "-m", "clover.cli.main", "serve", "--model", str(broken), "--port", str(free_port()),
           "--threads", "1", "--device", "cpu"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("clover serve: error: could not load")
