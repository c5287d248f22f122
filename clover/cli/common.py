"""What several commands share: `--model` and `--device` checks, SIGTERM as an exception, and the
split of failures into user errors (exit 2, one line) and internal errors (exit 1)."""

import json
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

SIGTERM_EXIT = 128 + signal.SIGTERM  # 143, the shell's code for a process ended by SIGTERM


def add_block_rule_arguments(p, whose: str = "") -> None:
    """`--fallback` and `--fill`, block diffusion's rules (choices checked when the settings are
    validated); `whose` qualifies their defaults in the help, e.g. "of requests that name none"."""
    default = f"default{' ' + whose if whose else ''}: the checkpoint's generation config"
    p.add_argument("--fallback", default=None, metavar="{confidence,causal}",
                   help=f"block diffusion when no masked position can be filled: fill the most confident one, "
                        f"or ask the causal mode ({default})")
    p.add_argument("--fill", default=None, metavar="{threshold,prefix}",
                   help=f"which masked positions above the threshold a block-diffusion step fills: all, or "
                        f"only those whose positions to the left are all filled ({default})")


class UserError(ValueError):
    """A failure the user can fix (bad argument, file or folder): one line, exit 2."""


def json_option(pair: str, flag: str, example: str) -> tuple[str, object]:
    """`"balanced=true"` -> `("balanced", True)`: a NAME=JSON pair from the command line, the value
    read as JSON; a malformed pair is a UserError naming it, the flag and an `example`."""
    name, sep, value = pair.partition("=")
    if name and sep:
        try:
            return name, json.loads(value)
        except json.JSONDecodeError:
            pass
    raise UserError(f"{flag} {pair!r}: expected NAME=JSON, e.g. {example}")


def is_user_error(e: BaseException) -> bool:
    """Bad values, missing or unreadable files and folders, malformed JSON / YAML / safetensors."""
    if isinstance(e, (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError, FileExistsError,
                      PermissionError, UnicodeError)):
        return True
    module = type(e).__module__ or ""
    return module.split(".")[0] in ("yaml", "safetensors_rust") or type(e).__name__ == "SafetensorError"


def hub_id_like(name: str) -> bool:
    """'owner/name' with no leading '.', '/' or '~': what the Hugging Face Hub would take it for."""
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "~")) and "\\" not in name


def model_path(name: str, hub_ok: bool = True) -> str:
    """`--model` as given when it is a local folder. A name that is no local folder is refused,
    unless it looks like a Hub repo id and `hub_ok`: then the user is told it is used as one."""
    path = Path(name).expanduser()
    if path.is_dir():
        return str(path)
    if path.exists():
        raise UserError(f"--model {name}: is a file, not a checkpoint folder")
    if hub_ok and hub_id_like(name):
        print(f"[--model {name}: no such local folder ({Path.cwd() / name}); using it as a Hugging Face "
              "Hub repo id]", file=sys.stderr)
        return name
    hint = " (a Hub repo id? download it first; this command reads local folders only)" \
        if hub_id_like(name) else ""
    raise UserError(f"--model {name}: no such folder ({path.resolve()}){hint}")


def check_device(name: str | None) -> None:
    """Refuse a device torch does not know or this machine lacks, before any loading."""
    if name in (None, "auto"):
        return
    import torch

    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise UserError(f"--device {name!r} is not a torch device (e.g. cpu, cuda, cuda:1, mps)") from e
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"--device {name}: CUDA is not available on this machine")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UserError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise UserError(f"--device {name}: MPS is not available on this machine")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise UserError(f"--device {name}: device type {device.type!r} is not supported (cpu, cuda, mps)")


@contextmanager
def sigterm_raises():
    """While active (main thread only), SIGTERM raises SystemExit(143) so `finally` blocks and
    temporary-folder cleanups run instead of the process vanishing mid-write."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum, frame):
        raise SystemExit(SIGTERM_EXIT)

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
