"""lm-eval (a client nobody here wrote) against `clover serve`, beside `clover eval` on the same prompts.

    OMP_NUM_THREADS=1 python benchmarks/lm_eval/run.py [--model DIR] [--limit 20] [--choice-limit 10]

1. writes the task documents (`task_docs.py`) from clover's held-out eval prompts into --data;
2. starts `clover serve --model DIR --port <free>` (default settings otherwise) and waits for it;
3. runs lm-eval's clover_generate (chat completions) and clover_joint_choice (completions with
   echo + logprobs) against it (`harness.py`), then stops the server;
4. runs `clover eval --task all --limit N --seed S --no-ar --json` on the same prompts, and scores
   the choice documents with the model's own causal log-likelihoods (`reference.py`);
5. prints both side by side (and one JSON object as the last line with --json).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clover_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "clover.cli.main", *args]


def child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def wait_ready(url: str, server: subprocess.Popen, timeout: float = 300) -> str:
    """The served model's id, once the server answers /v1/models."""
    deadline = time.time() + timeout
    while True:
        if server.poll() is not None:
            raise RuntimeError(f"clover serve exited with {server.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"{url}/v1/models", timeout=5) as r:
                return json.load(r)["data"][0]["id"]
        except OSError:
            if time.time() > deadline:
                raise TimeoutError(f"clover serve at {url} not ready after {timeout} s") from None
            time.sleep(0.5)


def run_lm_eval(model_dir: Path, data_dir: Path, log: Path) -> dict:
    import harness

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(log, "w") as out:
        server = subprocess.Popen(clover_command("serve", "--model", str(model_dir), "--port", str(port)),
                                  env=child_env(), stdout=out, stderr=subprocess.STDOUT)
    try:
        name = wait_ready(url, server)
        return {"generate": harness.generate_scores(f"{url}/v1", name, data_dir),
                "choice": harness.choice_scores(f"{url}/v1", name, data_dir, model_dir)}
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)


def run_clover_eval(model_dir: Path, limit: int, seed: int) -> dict:
    cmd = clover_command("eval", "--model", str(model_dir), "--task", "all", "--limit", str(limit),
                         "--seed", str(seed), "--no-ar", "--json")
    done = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, check=True)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return {"exact_match": report["accuracy"], "n": report["n"], "per_task": report["per_task_accuracy"]}


def table(lm: dict, ours: dict) -> list[str]:
    g, c = lm["generate"], lm["choice"]
    lines = [f"{'task':<24}{'n':>5}{'lm-eval':>10}{'clover':>10}",
             f"{'generate (exact match)':<24}{g['n']:>5}{g['exact_match']:>10.3f}{ours['generate']['exact_match']:>10.3f}"]
    for task, value in g["per_task"].items():
        lines.append(f"  {task:<22}{'':>5}{value:>10.3f}{ours['generate']['per_task'][task]:>10.3f}")
    lines.append(f"{'joint choice (acc)':<24}{c['n']:>5}{c['acc']:>10.3f}{ours['choice']['acc']:>10.3f}")
    diff = max(abs(a - b) for x, y in zip(c["loglikelihoods"], ours["choice"]["loglikelihoods"])
               for a, b in zip(x, y))
    lines.append(f"max |lm-eval - clover| choice log-likelihood: {diff:.2e}")
    return lines


def main() -> int:
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(ROOT))
    import clover
    import task_docs
    from clover.loading import load_model_and_tokenizer
    from reference import choice_scores

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=None, help="checkpoint folder (default: the embedded model)")
    p.add_argument("--limit", type=int, default=20, help="generate prompts per clover task (default 20)")
    p.add_argument("--choice-limit", type=int, default=10, help="joint prompts for the choice task (default 10)")
    p.add_argument("--seed", type=int, default=0, help="clover eval's split seed")
    p.add_argument("--data", type=Path, default=None, help="where the documents go (default: a temp folder)")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = p.parse_args()
    model_dir = Path(args.model or clover.default_model_dir()).resolve()
    data_dir = args.data or Path(tempfile.mkdtemp(prefix="clover-lm-eval-"))
    model, tokenizer = load_model_and_tokenizer(model_dir)
    choice = task_docs.choice_docs(tokenizer, args.choice_limit, args.seed)
    task_docs.write_docs(data_dir, {task_docs.GENERATE: task_docs.generate_docs(args.limit, args.seed),
                                    task_docs.CHOICE: choice})
    started = time.perf_counter()
    lm = run_lm_eval(model_dir, data_dir, data_dir / "serve.log")
    lm_seconds = time.perf_counter() - started
    ours = {"generate": run_clover_eval(model_dir, args.limit, args.seed),
            "choice": choice_scores(model, tokenizer, choice)}
    import lm_eval

    print(f"model {model_dir}  lm-eval {lm_eval.__version__}  limit {args.limit}/task  "
          f"choice docs {len(choice)} (from {args.choice_limit} joint prompts)  seed {args.seed}  "
          f"lm-eval run {lm_seconds:.0f} s  data {data_dir}")
    print("\n".join(table(lm, ours)))
    if args.json:
        for side in (lm, ours):
            side["choice"].pop("loglikelihoods")
        lm["generate"].pop("responses")
        print(json.dumps({"lm_eval": lm, "clover": ours}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
