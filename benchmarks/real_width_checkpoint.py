"""The real-widths slice as a checkpoint: write it in the Hugging Face release layout, convert it with
`clover convert`, load it, and check C1 against transformers -- each step in its own process, with
the peak RSS it reached (`/usr/bin/time -v`, "Maximum resident set size") against the checkpoint's
bytes.

Reproduce:  nice -n 19 python benchmarks/real_width_checkpoint.py --dir /tmp/clover-real-width
            (about 18 GB of disk for the two checkpoints; --steps picks steps, --clean deletes the
            folder at the end)

The slice (`clover.checkpoint.release_layout.REAL_WIDTHS_SLICE`): the released per-layer shapes on
4 layers (3 GDN, 1 attention), random bf16 weights, ~8.8 GB. `baseline` is the peak RSS of a process
that imports torch, transformers and clover and loads nothing: what the interpreter costs.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STEPS = ("write", "baseline", "convert", "load", "c1")
# the slice has no tokenizer; <|mask|> takes the last embedding row (past Qwen3.5's ~248k real tokens),
# so the vocabulary keeps its 248320 rows and transformers' model can share our tensors in `c1`
MASK_ID = 248319
BASELINE = "import torch, transformers, clover.model, clover.checkpoint"
WRITE = ("from clover.checkpoint.release_layout import write_release_checkpoint; "
         "write_release_checkpoint({path!r})")
LOAD = ("import torch; from clover.model import CloverMoeForCausalLM; "
        "m = CloverMoeForCausalLM.from_pretrained({path!r}); "
        "print('loaded', sum(p.nbytes for p in m.parameters()))")


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.glob("*.safetensors"))


def timed(argv: list[str]) -> dict:
    """Run argv under `/usr/bin/time -v` (1 OpenMP thread); its wall seconds, peak RSS and output."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    done = subprocess.run(["/usr/bin/time", "-v", *argv], env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{argv} failed ({done.returncode}):\n{done.stdout}\n{done.stderr[-4000:]}")
    peak = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)[1]) * 1024
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", done.stderr)[1]
    seconds = sum(float(x) * 60 ** i for i, x in enumerate(reversed(wall.split(":"))))
    return {"peak_rss": peak, "seconds": seconds, "stdout": done.stdout, "stderr": done.stderr}


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def run_steps(root: Path, steps: list[str]) -> dict:
    src, dst = root / "release", root / "clover"
    results = {}
    if "write" in steps:
        shutil.rmtree(src, ignore_errors=True)
        results["write"] = timed(python(WRITE.format(path=str(src))))
    if "baseline" in steps:
        results["baseline"] = timed(python(BASELINE))
    if "convert" in steps:
        shutil.rmtree(dst, ignore_errors=True)
        results["convert"] = timed([sys.executable, "-m", "clover.cli.main", "convert", str(src), str(dst),
                                    "--mask-token-id", str(MASK_ID)])
    if "load" in steps:
        results["load"] = timed(python(LOAD.format(path=str(dst))))
    if "c1" in steps:
        results["c1"] = timed([sys.executable, str(REPO / "benchmarks" / "real_width_c1.py"), str(src), str(dst)])
    return results


def report(root: Path, results: dict) -> str:
    sizes = {name: folder_bytes(root / name) for name in ("release", "clover") if (root / name).is_dir()}
    lines = ["checkpoint bytes: " + ", ".join(f"{k} {v / 1e9:.2f} GB" for k, v in sizes.items()), "",
             "| step | wall s | peak RSS GB | / checkpoint bytes |", "|---|---:|---:|---:|"]
    for step, r in results.items():
        size = sizes.get("clover" if step in ("load", "c1") else "release", 0)
        ratio = f"{r['peak_rss'] / size:.2f}" if size else "–"
        lines.append(f"| {step} | {r['seconds']:.0f} | {r['peak_rss'] / 1e9:.2f} | {ratio} |")
    for step in ("c1", "load"):
        if step in results:
            lines += ["", f"{step} output:", *results[step]["stdout"].strip().splitlines()]
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/clover-real-width"))
    parser.add_argument("--steps", nargs="+", default=list(STEPS), choices=STEPS)
    parser.add_argument("--clean", action="store_true", help="delete --dir at the end")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    args = parser.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    results = run_steps(args.dir, args.steps)
    print(report(args.dir, results), flush=True)
    if args.json:
        args.json.write_text(json.dumps({k: {x: y for x, y in v.items() if x != "stderr"}
                                         for k, v in results.items()}, indent=2))
    if args.clean:
        shutil.rmtree(args.dir)


if __name__ == "__main__":
    main()
