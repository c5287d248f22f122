"""Grammar libraries for `response_format` compared on the embedded model's tokenizer (CPU).

For xgrammar, llguidance and outlines-core, each installed at a pinned version: the time to import,
to adapt the tokenizer, to compile the airspace answer's JSON schema (a list of objects with
id / location / radius_km / start / end), and, walking the tokens of real answers, the time to
compute the allowed-token mask before each token and to advance past it. A random walk (a uniformly
drawn allowed token at each step, as a random-weight model would) checks that every library keeps
the output inside the schema.

    OMP_NUM_THREADS=1 nice -n 19 python benchmarks/grammar_libraries.py [--write]

`--write` replaces the "Structured output: grammar libraries" section of BENCHMARKS.md. Only llguidance
is a dependency; for the others: `pip install xgrammar==0.2.8 outlines-core==0.2.14` (xgrammar pulls
triton; `pip install --no-deps xgrammar==0.2.8 apache-tvm-ffi==0.1.15.post2` is enough on a CPU).
"""

import argparse
import importlib.metadata as md
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import write_section  # noqa: E402

from clover.data import get_task  # noqa: E402

TIME = {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"}
AIRSPACE_SCHEMA = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {"id": {"type": "string"}, "location": {"type": "string"},
                       "radius_km": {"type": "number"}, "start": TIME, "end": TIME},
        "required": ["id", "location", "radius_km", "start", "end"],
        "additionalProperties": False,
    },
}


def byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: the character a byte-level BPE token uses -> the byte."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


class XGrammar:
    name, package = "xgrammar", "xgrammar"

    def __init__(self, tokenizer, eos):
        import xgrammar as xgr
        self.xgr, self.vocab = xgr, len(tokenizer)
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=self.vocab, stop_token_ids=eos)
        self.compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self.bitmask = xgr.allocate_token_bitmask(1, self.vocab)

    def compile(self, schema):
        return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":"),
                                                   strict_mode=True)

    def start(self, compiled):
        self.matcher = self.xgr.GrammarMatcher(compiled)

    def mask(self) -> torch.Tensor:
        self.matcher.fill_next_token_bitmask(self.bitmask)
        return self.bitmask[0]

    def advance(self, token):
        assert self.matcher.accept_token(token), token


class LLGuidance:
    name, package = "llguidance", "llguidance"

    def __init__(self, tokenizer, eos):
        import llguidance
        import llguidance.hf  # not llguidance.torch: its torch.compile import costs seconds
        self.ll = llguidance
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=len(tokenizer), eos_token=eos)
        self.bitmask = torch.zeros(1, (len(tokenizer) + 31) // 32, dtype=torch.int32)

    def compile(self, schema):
        grammar = self.ll.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})
        matcher = self.ll.LLMatcher(self.tokenizer, grammar)
        assert not matcher.is_error(), matcher.get_error()
        return grammar

    def start(self, grammar):
        self.matcher = self.ll.LLMatcher(self.tokenizer, grammar)

    def mask(self) -> torch.Tensor:
        self.matcher.unsafe_compute_mask_ptr(self.bitmask.data_ptr(), self.bitmask.numel() * 4)
        return self.bitmask[0]

    def advance(self, token):
        assert self.matcher.consume_token(token), self.matcher.get_error()


class OutlinesCore:
    name, package = "outlines-core", "outlines_core"

    def __init__(self, tokenizer, eos):
        import outlines_core
        from outlines_core.json_schema import build_regex_from_schema
        self.oc, self.regex_of = outlines_core, build_regex_from_schema
        chars, specials = byte_decoder(), set(tokenizer.all_special_ids)
        tokens: dict[bytes, list[int]] = {}
        for text, i in tokenizer.get_vocab().items():
            if i not in specials:
                tokens.setdefault(bytes(chars[c] for c in text), []).append(i)
        self.vocabulary = outlines_core.Vocabulary(eos[0], tokens)
        self.vocab = len(tokenizer)
        self.bitmask = torch.zeros(1, (self.vocab + 31) // 32, dtype=torch.int32)

    def compile(self, schema):
        return self.oc.Index(self.regex_of(json.dumps(schema)), self.vocabulary)

    def start(self, index):
        self.guide = self.oc.Guide(index)

    def mask(self) -> torch.Tensor:
        self.guide.write_mask_into(self.bitmask.data_ptr(), self.bitmask.numel(), self.bitmask.element_size())
        return self.bitmask[0]

    def advance(self, token):
        self.guide.advance(token)


def allowed(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """int32 bitmask [W] -> bool [V]."""
    bits = (bitmask[:, None] >> torch.arange(32, dtype=torch.int32)) & 1  # [W, 32]
    return bits.flatten()[:vocab].bool()


def timed(fn, *args):
    t = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t


def walk(lib, compiled, tokens: list[int], vocab: int) -> tuple[list[float], list[float]]:
    """Mask then advance along `tokens`; every token must be allowed. Returns the times (s)."""
    lib.start(compiled)
    masks, advances = [], []
    for token in tokens:
        mask, dt = timed(lib.mask)
        masks.append(dt)
        assert allowed(mask, vocab)[token], (lib.name, token)
        _, dt = timed(lib.advance, token)
        advances.append(dt)
    return masks, advances


def random_walk(lib, compiled, vocab: int, eos: list[int], rng: random.Random,
                steps: int) -> tuple[list[int], bool]:
    """Draw a uniformly random allowed token at each step until an EOS (True) or `steps` tokens."""
    lib.start(compiled)
    out = []
    for _ in range(steps):
        ids = allowed(lib.mask(), vocab).nonzero().flatten().tolist()
        token = rng.choice(ids)
        if token in eos:
            return out, True
        lib.advance(token)
        out.append(token)
    return out, False


def is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def measure(cls, tokenizer, eos, answers: list[list[int]], repeats: int, seed: int) -> dict:
    t = time.perf_counter()
    __import__(cls.package)
    import_s = time.perf_counter() - t
    lib, init_s = timed(cls, tokenizer, eos)
    compiled, compile_s = timed(lib.compile, AIRSPACE_SCHEMA)
    compile_again = [timed(lib.compile, AIRSPACE_SCHEMA)[1] for _ in range(repeats)]
    object_s = timed(lib.compile, {"type": "object"})[1]  # json_object: any JSON object (recursive)
    masks, advances = [], []
    for answer in answers:
        m, a = walk(lib, compiled, answer, len(tokenizer))
        masks += m
        advances += a
    rng, ended, valid = random.Random(seed), 0, 0
    for _ in range(20):
        out, done = random_walk(lib, compiled, len(tokenizer), eos, rng, 400)
        if done:
            ended += 1
            valid += is_json(tokenizer.decode(out))
    return dict(name=cls.name, version=md.version(cls.name), import_s=import_s, init_s=init_s,
                compile_s=compile_s, compile_again_s=statistics.median(compile_again), object_s=object_s,
                mask_us=statistics.mean(masks) * 1e6, mask_p99_us=sorted(masks)[int(0.99 * len(masks))] * 1e6,
                mask_median_us=statistics.median(masks) * 1e6, advance_us=statistics.mean(advances) * 1e6,
                tokens=len(masks), random_ended=ended, random_valid=valid)


LIBRARIES = (XGrammar, LLGuidance, OutlinesCore)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--answers", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--write", action="store_true")
    p.add_argument("--only", choices=[c.name for c in LIBRARIES], help="measure one library, print JSON")
    args = p.parse_args()
    if args.only is None:  # each library in a fresh process: no library's threads or imports skew another's
        common_args = ["--answers", str(args.answers), "--repeats", str(args.repeats)]
        rows = [json.loads(subprocess.run([sys.executable, __file__, "--only", c.name] + common_args, check=True,
                                          capture_output=True, text=True).stdout.splitlines()[-1])
                for c in LIBRARIES]
        report(rows, args)
        return
    torch.set_num_threads(1)
    from clover.data.tokenizer import load_tokenizer
    tokenizer = load_tokenizer(ROOT / "clover/assets/clover-tiny")
    eos = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    task = get_task("airspace")
    answers = [tokenizer.encode(task.generate(seed=s, split="eval").answer) for s in range(args.answers)]
    cls = next(c for c in LIBRARIES if c.name == args.only)
    print(json.dumps(measure(cls, tokenizer, eos, answers, args.repeats, seed=0) | {"vocab": len(tokenizer)}))


def report(rows: list[dict], args) -> None:
    lines = [
        f"Airspace answer schema on the embedded tokenizer (vocab {rows[0]['vocab']}), one CPU thread, each "
        "library in a fresh process; "
        f"mask = allowed-token bitmask before each of {rows[0]['tokens']} answer tokens "
        f"({args.answers} eval answers); random walk = 20 outputs drawn uniformly among allowed tokens, "
        "at most 400 tokens (those that ended with EOS parsed as JSON). "
        "Command: `OMP_NUM_THREADS=1 nice -n 19 python benchmarks/grammar_libraries.py --write`.",
        "",
        "| library | import s | tokenizer s | compile ms (first / again) | json_object compile s "
        "| mask µs (mean / median / p99) | advance µs | random walks: ended / valid JSON |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['name']} {r['version']} | {r['import_s']:.2f} | {r['init_s']:.3f} | "
                     f"{r['compile_s'] * 1e3:.1f} / {r['compile_again_s'] * 1e3:.1f} | {r['object_s']:.3f} | "
                     f"{r['mask_us']:.0f} / {r['mask_median_us']:.0f} / {r['mask_p99_us']:.0f} | "
                     f"{r['advance_us']:.0f} | "
                     f"{r['random_ended']} / {r['random_valid']} |")
    print("\n".join(lines))
    if args.write:
        write_section(ROOT / "BENCHMARKS.md", "Structured output: grammar libraries", lines)


if __name__ == "__main__":
    main()
