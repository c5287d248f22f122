"""`clover generate`: decode one prompt, streaming text as blocks commit.

    clover generate "Why is the sky blue?" --chat --max-new-tokens 256
    echo "Once upon a time" | clover generate - --show-denoising

Sampling: `--temperature T > 0`, `--top-p` or `--top-k` turn sampling on; `--temperature 0` forces
greedy; with none of them the checkpoint's `do_sample` decides. The statistics line goes to stderr.
"""

import argparse
import shutil
import sys
import time

from .common import UserError, add_block_rule_arguments
from .model_options import add_model_arguments, load_options, model_dir

MASK_GLYPH = "░"
CLEAR_LINE = "\r\x1b[K"


def register(sub) -> None:
    p = sub.add_parser("generate", help="generate text with block diffusion (or AR)")
    p.add_argument("prompt", nargs="?", help="prompt text, '-' to read stdin (default: a built-in airspace example)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    p.add_argument("--system", default=None, help="system message (with --chat)")
    p.add_argument("--enable-thinking", dest="thinking", action="store_true", default=None,
                   help="open the assistant turn in thinking mode (with --chat)")
    p.add_argument("--no-thinking", dest="thinking", action="store_false",
                   help="start the assistant turn with an empty think block (with --chat)")
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--threshold", type=float, default=None)
    add_block_rule_arguments(p)
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--show-denoising", action="store_true", help="show the current block filling in")
    p.add_argument("--ar", action="store_true", help="autoregressive decoding (one token per forward)")
    p.add_argument("--self-spec", action="store_true",
                   help="self-speculative decoding: block-mode drafts verified causally (AR's output, SPEC §7)")
    add_model_arguments(p)
    p.set_defaults(run=run)


def builtin_example() -> str:
    """The drone demo: airspace notices in, no-fly zones as JSON out (a held-out example)."""
    from clover.data import get_task

    return get_task("airspace").generate(seed=7, split="eval").prompt


def read_prompt(prompt: str | None, stdin=None) -> str:
    """PROMPT, or for '-' the UTF-8 text on stdin (binary input is refused with one line)."""
    if prompt != "-":
        return prompt
    stdin = stdin or sys.stdin
    data = stdin.buffer.read() if hasattr(stdin, "buffer") else stdin.read().encode("utf-8", "surrogateescape")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"stdin is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); "
                        "pass a text prompt") from None
    if "\0" in text:
        raise UserError(f"stdin holds a NUL byte at offset {text.index(chr(0))}: binary data, not a text prompt")
    return text


def apply_builtin_example(args: argparse.Namespace) -> None:
    """No PROMPT: run the built-in airspace example as a chat turn (the template's default
    thinking mode, as every other entry point)."""
    if args.prompt is None:
        args.prompt, args.chat = builtin_example(), True


def prompt_ids(tokenizer, text: str, args) -> list[int]:
    if not args.chat:
        return tokenizer(text).input_ids
    messages = ([{"role": "system", "content": args.system}] if args.system else [])
    messages.append({"role": "user", "content": text})
    extra = {} if args.thinking is None else {"enable_thinking": args.thinking}
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **extra)
    return tokenizer(rendered).input_ids


def special_ids(model, tokenizer) -> dict:
    """EOS / pad / think ids from the tokenizer, for whatever the checkpoint's config leaves unset."""
    from clover.model.generation_config import THINK_TOKENS, chat_token_ids

    settings, ids = {}, chat_token_ids(tokenizer)
    checkpoint = getattr(model, "generation_config", None)
    if getattr(checkpoint, "eos_token_id", None) is None:
        settings["eos_token_id"] = ids["eos_token_id"] or tokenizer.eos_token_id
    if getattr(checkpoint, "pad_token_id", None) is None and tokenizer.pad_token_id is not None:
        settings["pad_token_id"] = tokenizer.pad_token_id
    for name in THINK_TOKENS:
        if getattr(checkpoint, name, None) is None and name in ids:
            settings[name] = ids[name]
    return settings


def decode_settings(args) -> dict:
    settings = dict(max_new_tokens=args.max_new_tokens, block_size=args.block_size,
                    threshold=args.threshold, fallback=args.fallback, fill=args.fill, top_p=args.top_p,
                    top_k=args.top_k, seed=args.seed)
    if args.temperature == 0:
        settings["do_sample"] = False
    elif args.temperature is not None or args.top_p is not None or args.top_k is not None:
        settings.update(do_sample=True, temperature=args.temperature)
    if args.ar and args.self_spec:
        raise ValueError("--ar and --self-spec are exclusive: choose one decoding mode")
    if args.ar:
        settings["mode"] = "ar"
    elif args.self_spec:
        settings["mode"] = "self_spec"
    return settings


class TextStream:
    """Incremental detokenisation: decode the whole response, emit the new suffix; a trailing
    incomplete UTF-8 sequence (U+FFFD) waits for the next tokens."""

    def __init__(self, tokenizer, hidden: set[int]):
        self.tokenizer, self.hidden = tokenizer, hidden
        self.tokens: list[int] = []
        self.emitted = 0

    def add(self, tokens: list[int], final: bool = False) -> str:
        self.tokens += [t for t in tokens if t not in self.hidden]
        text = self.tokenizer.decode(self.tokens)
        if text.endswith("\ufffd") and not final:
            return ""
        new, self.emitted = text[self.emitted:], len(text)
        return new


class DenoisingView:
    """The current block below the committed text. On a terminal one status line is redrawn in
    place (ANSI); otherwise each step prints a plain line."""

    def __init__(self, tokenizer, out, tty: bool):
        self.tokenizer, self.out, self.tty = tokenizer, out, tty
        self.partial = ""  # committed text after the last newline (tty: lives on the status line)

    def render(self, block: list[int], mask_id: int) -> str:
        pieces = [MASK_GLYPH if t == mask_id else self.tokenizer.decode([t]) for t in block]
        return "".join(pieces).replace("\n", "⏎")

    def step(self, event, mask_id: int) -> None:
        view = self.render(event.block[0].tolist(), mask_id)
        if self.tty:
            width = shutil.get_terminal_size().columns - 1
            self.out.write(CLEAR_LINE + (self.partial + "\x1b[2m" + view)[-width:] + "\x1b[0m")
        else:
            self.out.write(f"[block {event.block_index}] {view}\n")
        self.out.flush()

    def commit(self, text: str) -> None:
        if not self.tty:
            self.out.write(f"[commit] {text!r}\n")
            return
        lines = (self.partial + text).split("\n")
        self.out.write(CLEAR_LINE + "".join(line + "\n" for line in lines[:-1]))
        self.partial = lines[-1]

    def close(self) -> None:
        self.out.write((CLEAR_LINE + self.partial + "\n") if self.tty else "")


def eos_ids(model, settings: dict) -> set[int]:
    """The EOS ids this request will use (they end the response and are not printed)."""
    from clover.model.generation_config import FIELDS, resolve_config

    known = {k: v for k, v in settings.items() if k in FIELDS}
    return set(resolve_config(getattr(model, "generation_config", None), model.config, known).eos_token_id)


def stream_text(model, tokenizer, ids: list[int], settings: dict, show_denoising: bool, out) -> object:
    """Decode, writing text to `out` as blocks commit; returns the `GenerateOutput`."""
    import torch

    from clover.model.generation_batch import BlockEvent, DoneEvent, StepEvent

    text = TextStream(tokenizer, eos_ids(model, settings))
    view = DenoisingView(tokenizer, out, out.isatty()) if show_denoising else None
    mask_id = model.config.mask_token_id
    events = model.stream_generate(torch.tensor([ids], device=model.device), **settings)
    output = None
    for event in events:
        if isinstance(event, StepEvent) and view is not None:
            view.step(event, mask_id)
        elif isinstance(event, BlockEvent):
            new = text.add(event.tokens, final=event.finished)
            if view is not None:
                view.commit(new)
            else:
                out.write(new)
                out.flush()
        elif isinstance(event, DoneEvent):
            output = event.output
    if view is not None:
        view.close()
    elif not text.tokenizer.decode(text.tokens).endswith("\n"):
        out.write("\n")
    out.flush()
    return output


def stats_line(output, seconds: float) -> str:
    row = output.rows[0]
    return (f"[{row.new_tokens} tokens, {output.num_forward_passes} forwards, "
            f"{row.tokens_per_forward:.2f} tokens/forward, "
            f"{row.new_tokens / max(seconds, 1e-9):.1f} tokens/s, "
            f"stop: {row.stop_reason}]")


def generate_text(model, tokenizer, args, prompt: str, out=None, err=None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    ids = prompt_ids(tokenizer, prompt, args)
    settings = {k: v for k, v in decode_settings(args).items() if v is not None}
    settings.update(special_ids(model, tokenizer))
    start = time.perf_counter()
    output = stream_text(model, tokenizer, ids, settings, args.show_denoising, out)
    err.write(stats_line(output, time.perf_counter() - start) + "\n")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.prompt is None:
        apply_builtin_example(args)
        sys.stderr.write(f"[no PROMPT given: the built-in airspace example]\n{args.prompt}\n\n")
    directory, options = model_dir(args), load_options(args)  # checked before stdin is read
    prompt = read_prompt(args.prompt)
    from clover.loading import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(directory, options)
    return generate_text(model, tokenizer, args, prompt)
