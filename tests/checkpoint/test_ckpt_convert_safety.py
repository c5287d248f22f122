"""`clover convert` loses nothing: a non-empty DST is refused unless --overwrite (and then only a
Clover checkpoint is replaced), DST may not be, lie inside or contain SRC, SIGTERM removes the
partial output, and temporaries of a killed earlier run are removed."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ckpt_helpers import hf_model, save_hf
from clover.checkpoint import convert_checkpoint
from clover.cli.main import main
from clover.model.checkpoint_save import remove_stale_siblings

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    return save_hf(hf_model(seed=5), tmp_path_factory.mktemp("src") / "hf")


def tree(path: Path) -> dict:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def convert_cli(capsys, *argv) -> tuple[int, str]:
    code = main(["convert", *map(str, argv)])
    return code, capsys.readouterr().err


def test_non_empty_destination_is_refused(hf, tmp_path, capsys):
    dst = tmp_path / "work"
    dst.mkdir()
    (dst / "notes.txt").write_text("precious")
    code, err = convert_cli(capsys, hf, dst)
    assert code == 2 and "not empty" in err and "--overwrite" in err and len(err.strip().splitlines()) == 1
    code, err = convert_cli(capsys, hf, dst, "--overwrite")  # not a Clover checkpoint: still refused
    assert code == 2 and "not a Clover checkpoint" in err
    assert tree(dst) == {"notes.txt": b"precious"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]  # no temporary left


def test_overwrite_replaces_a_clover_checkpoint(hf, tmp_path, capsys):
    dst = tmp_path / "out"
    convert_checkpoint(hf, dst)
    before = tree(dst)
    code, err = convert_cli(capsys, hf, dst, "--block-size", "8")
    assert code == 2 and "not empty" in err and tree(dst) == before
    assert convert_cli(capsys, hf, dst, "--block-size", "8", "--overwrite")[0] == 0
    assert json.loads((dst / "config.json").read_text())["block_size"] == 8
    empty = tmp_path / "empty"
    empty.mkdir()
    assert convert_cli(capsys, hf, empty)[0] == 0 and (empty / "config.json").is_file()


@pytest.mark.parametrize("where", ["same", "inside", "containing", "same_via_symlink"])
def test_destination_overlapping_the_source_is_refused(hf, tmp_path, capsys, where):
    src = tmp_path / "parent" / "src"
    src.parent.mkdir()
    convert_checkpoint(hf, src)  # a Clover checkpoint: even --overwrite may not touch it
    before = tree(tmp_path)
    link = tmp_path / "link"
    link.symlink_to(src)
    dst = {"same": src, "inside": src / "sub", "containing": src.parent, "same_via_symlink": link}[where]
    code, err = convert_cli(capsys, src, dst, "--overwrite")
    assert code == 2 and "source checkpoint" in err, err
    link.unlink()
    assert tree(tmp_path) == before


def test_destination_that_is_a_file_is_one_line(hf, tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    code, err = convert_cli(capsys, hf, tmp_path / "file")
    assert code == 2 and "is a file" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def dead_pid() -> int:
    pid = 4_000_000
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
        pid += 1


def test_stale_temporaries_are_removed(hf, tmp_path):
    dst = tmp_path / "out"
    dead, alive = dead_pid(), os.getpid()
    stale = [tmp_path / f".out.tmp-{dead}-0123abcd", tmp_path / ".out.tmp-89abcdef"]  # killed; pre-tag
    live = tmp_path / f".out.tmp-{alive}-deadbeef"  # a conversion still running
    other = tmp_path / f".other.tmp-{dead}-0123abcd"  # another target's
    for d in (*stale, live, other):
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"partial")
    convert_checkpoint(hf, dst)
    assert not any(d.exists() for d in stale) and live.exists() and other.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([".other.tmp-%d-0123abcd" % dead, live.name, "out"])


def test_swap_cut_short_is_undone(tmp_path):
    """Killed between the two renames of the swap: the old checkpoint is put back, the new removed."""
    dead = dead_pid()
    old = tmp_path / f".ck.old-{dead}-0123abcd"
    new = tmp_path / f".ck.tmp-{dead}-0123abcd"
    for d, text in ((old, "old"), (new, "new")):
        d.mkdir()
        (d / "config.json").write_text(text)
    assert remove_stale_siblings(tmp_path / "ck") == [new]
    assert (tmp_path / "ck" / "config.json").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


def test_sigterm_mid_conversion_leaves_no_temporary(hf, tmp_path):
    """SIGTERM arrives while the first weight file is being written (the process signals itself)."""
    code = f"""
import os, signal, sys
sys.path[:0] = [{str(REPO)!r}]
import clover.model.checkpoint_save as save
real = save.save_file
def save_file(*args, **kwargs):
    real(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGTERM)
save.save_file = save_file
from clover.cli.main import main
sys.exit(main(["convert", {str(hf)!r}, {str(tmp_path / 'out')!r}]))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
    assert list(tmp_path.iterdir()) == []
