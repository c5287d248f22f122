"""The embedded model gives the same greedy answer through every entry point a user may take with
default settings: `clover generate --chat`, the server's chat completions, the
model-card quick start (a fresh process that never imports clover) and transformers' `pipeline`.

Defaults come from the checkpoint's own files (generation_config.json, the chat template's default
thinking mode), so no entry point passes generation settings here beyond greedy decoding.
"""

import os
import socket
import subprocess
import sys
import time

import pytest
import torch

import clover
from clover.data import get_task

TASK = get_task("airspace")
EXAMPLE = TASK.generate(seed=7, split="eval")  # the built-in example of `clover generate`
MESSAGES = [{"role": "user", "content": EXAMPLE.prompt}]

QUICK_START = """
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

model_id = {model_id!r}
tokenizer = AutoTokenizer.from_pretrained(model_id, trust_remote_code=True)
model = AutoModelForCausalLM.from_pretrained(model_id, trust_remote_code=True, dtype=torch.float32,
                                             device_map="cpu").eval()
prompt = tokenizer.apply_chat_template({messages!r}, tokenize=False, add_generation_prompt=True)
inputs = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")
output = model.generate(**inputs, max_new_tokens=512, do_sample=False)
print(repr(tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)))
import sys
print("clover imported:", "clover" in sys.modules)
"""


def _env(tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return env | {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def answer_of(text: str) -> str:
    """The answer part of a completion (after any think block, before end tokens)."""
    from clover.data.tasks.base import clean_output

    return clean_output(text)


def cli_answer(tmp_path) -> str:
    result = subprocess.run([sys.executable, "-m", "clover.cli.main", "generate", EXAMPLE.prompt, "--chat"],
                            env=os.environ | {"OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    return answer_of(result.stdout)


def quick_start_answer(tmp_path) -> str:
    script = QUICK_START.format(model_id=str(clover.default_model_dir()), messages=MESSAGES)
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=_env(tmp_path),
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "clover imported: False" in result.stdout
    return answer_of(eval(result.stdout.splitlines()[-2]))  # the repr() line


def pipeline_answer() -> str:
    from transformers import pipeline

    generator = pipeline("text-generation", model=str(clover.default_model_dir()), trust_remote_code=True,
                         dtype=torch.float32, device="cpu")
    out = generator(MESSAGES, max_new_tokens=512, do_sample=False)
    return answer_of(out[0]["generated_text"][-1]["content"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_answer(tmp_path) -> str:
    import urllib.request

    import openai

    port = _free_port()
    log = open(tmp_path / "serve.log", "w")
    server = subprocess.Popen([sys.executable, "-m", "clover.cli.main", "serve", "--port", str(port),
                               "--threads", "1", "--log-level", "warning"],
                              env=os.environ | {"OMP_NUM_THREADS": "1"}, stdout=log, stderr=log)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=5) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            assert server.poll() is None and time.time() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.2)
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", timeout=300)
        reply = client.chat.completions.create(model="clover-tiny", messages=MESSAGES)
        return answer_of(reply.choices[0].message.content)
    finally:
        server.terminate()
        server.wait(timeout=60)
        log.close()


def test_every_entry_point_gives_the_same_right_answer(tmp_path):
    answers = {
        "clover generate --chat": cli_answer(tmp_path),
        "server chat completions": server_answer(tmp_path),
        "model-card quick start": quick_start_answer(tmp_path),
        "pipeline": pipeline_answer(),
    }
    assert len(set(answers.values())) == 1, answers
    assert answers["pipeline"].startswith("["), answers  # the JSON answer, after an empty think block
