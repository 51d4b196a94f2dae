"""Builds never lose or mix data: one writer per output (a lock naming its holder), and a
ShardWriter never replaces a finished data set by accident."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import shardkit as sk
from shardkit.errors import ConfigError, WriterError
from shardkit.write.build import build
from shardkit.write.writer import WriterOptions
from tests.helpers.data import make_samples
from tests.helpers.readback import (
    assert_whole,
    hidden_leftovers,
    keys_of,
    read_samples,
    shardkit,
    shardkit_process,
)

pytestmark = pytest.mark.integration


def _start(*args: str | os.PathLike[str]) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "shardkit", *map(str, args)]
    with _sigint_not_ignored():
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@contextlib.contextmanager
def _sigint_not_ignored() -> Iterator[None]:
    """A child started in here gets SIGINT at its default, as a build run from a terminal
    does. A shell without job control ignores SIGINT in a job it runs in the background
    (`bash -c 'pytest ... & wait'`); pytest and the build inherit that and rightly keep it:
    the test's SIGINT was lost and the build waited on its FIFO for 60 s (as on CI). A
    signal the parent handles is reset to its default by exec."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_a_second_build_into_one_output_fails_at_once_naming_the_first(tmp_path: Path) -> None:
    """Two real ``shardkit build`` processes into one ``-o``: the first holds the output
    (it waits on a FIFO input the test feeds), the second exits 1 at once naming the
    first's pid and host; the first then finishes whole (they both exited 0, mixing data)."""
    raw = tmp_path / "raw"
    raw.mkdir()
    fifo = raw / "a.jsonl"
    os.mkfifo(fifo)
    other = tmp_path / "other"
    other.mkdir()
    (other / "b.jsonl").write_text("".join(f'{{"b": {i}}}\n' for i in range(50)))
    out = tmp_path / "out"
    first = _start("build", raw, "-o", out, "--maxcount", "10")
    try:
        with open(fifo, "w") as feed:  # returns once the first build reads its input
            second = shardkit_process("build", other, "-o", out, "--maxcount", "10")
            api: list[BaseException] = []
            try:
                build([str(other)], out, progress=False)
            except WriterError as exc:
                api.append(exc)
            feed.write("".join(f'{{"a": {i}}}\n' for i in range(35)))
    finally:
        _, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    assert second.returncode == 1, second.stderr
    line = second.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, second.stderr
    assert f"pid {first.pid} on host {socket.gethostname()}" in line, line
    assert str(out) in line and "another build" in line, line
    assert api and f"pid {first.pid}" in str(api[0])
    m = assert_whole(out / "manifest.json")
    assert m.total_samples == 35
    assert keys_of(read_samples(m)) == [f"a/{i + 1:09d}" for i in range(35)]
    assert not hidden_leftovers(out)  # no lock file left
    again = shardkit("build", other, "-o", tmp_path / "out2")  # a free output: no lock
    assert again.returncode == 0, again.stderr


def test_a_writer_holds_its_output_against_builds_and_threads(tmp_path: Path) -> None:
    out = tmp_path / "out"
    src = tmp_path / "in.jsonl"
    src.write_text('{"x": 1}\n')
    with sk.ShardWriter(out, maxcount=5) as w:
        w.write({"__key__": "k", "txt": "held"})
        r = shardkit_process("build", src, "-o", out)  # another process
        assert r.returncode == 1 and f"pid {os.getpid()} on host" in r.stderr, r.stderr
        errors: list[BaseException] = []

        def other_thread() -> None:
            try:
                sk.ShardWriter(out, prefix="other", manifest="manifest.json")
            except WriterError as exc:
                errors.append(exc)

        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
        assert errors and "another thread of this process" in str(errors[0])
    assert assert_whole(out / "manifest.json").total_samples == 1
    # a part of another prefix beside it is another output: allowed while one is open
    with (
        sk.ShardWriter(out, resume=True) as w1,
        sk.ShardWriter(out, prefix="p1", manifest="manifest.part-0001-of-0002.json") as w2,
    ):
        w1.write({"__key__": "k2", "txt": "a"})
        w2.write({"__key__": "k3", "txt": "b"})


def test_shard_writer_refuses_a_finished_data_set(tmp_path: Path) -> None:
    """300 samples became 1 and the old shard stayed as a stray file: now a ConfigError,
    unless ``overwrite=True`` (the old shards go) or ``resume=True`` (appended)."""
    out = tmp_path / "out"
    with sk.ShardWriter(out, maxcount=100) as w:
        for s in make_samples(300):
            w.write(s)
    before = read_samples(out / "manifest.json")
    with pytest.raises(ConfigError, match=r"already holds a data set .*3 shards, 300 samples"):
        sk.ShardWriter(out)
    assert read_samples(out / "manifest.json") == before  # untouched
    with sk.ShardWriter(out, resume=True, maxcount=100) as w:
        w.write({"__key__": "extra", "txt": "one more"})
    assert assert_whole(out / "manifest.json").total_samples == 301
    with sk.ShardWriter(out, overwrite=True, maxcount=100) as w:
        w.write({"__key__": "only", "txt": "one"})
    m = assert_whole(out / "manifest.json")
    assert m.total_samples == 1
    tars = sorted(p.name for p in out.glob("*.tar"))
    assert tars == [s.url for s in m.shards]  # no stray shard of the old set
    with pytest.raises(ConfigError, match="exclude each other"):
        sk.ShardWriter(out, resume=True, overwrite=True)


def test_writer_options_by_keyword_only(tmp_path: Path) -> None:
    """One spelling: keywords, made one frozen WriterOptions; a positional options object
    (once also taken, with keywords replacing its fields) is a ConfigError naming them."""
    with sk.ShardWriter(
        tmp_path / "b", prefix="x", maxsize="8KB", maxcount=3, compress="gzip"
    ) as w:
        for s in make_samples(7):
            w.write(s)
    assert w.options == WriterOptions(prefix="x", maxsize=8000, maxcount=3, compress="gzip")
    assert w.options.maxsize == 8000 and w.options.max_bytes == 8000
    b = sk.Manifest.load(tmp_path / "b" / "manifest.json")
    assert [s.url for s in b.shards] == [f"x-{i:06d}.tar.gz" for i in range(3)]
    with pytest.raises(ConfigError, match="unknown ShardWriter option maxcnt"):
        sk.ShardWriter(tmp_path / "d", maxcnt=3)  # type: ignore[call-arg]
    for misplaced in ("data", WriterOptions(maxcount=3)):
        with pytest.raises(ConfigError, match=r"by keyword.*ShardWriter\(out_dir, prefix="):
            sk.ShardWriter(tmp_path / "d", misplaced)
    with pytest.raises(ConfigError, match="too small"):
        WriterOptions(maxsize=100)


def test_ctrl_c_says_how_to_resume(tmp_path: Path) -> None:
    """SIGINT to a real build process: exit 130 and one message naming the command that
    finishes it; that command does."""
    raw = tmp_path / "raw"
    raw.mkdir()
    fifo = raw / "a.jsonl"
    os.mkfifo(fifo)
    out = tmp_path / "out"
    proc = _start("build", raw, "-o", out, "--maxcount", "10")
    with open(fifo, "w") as feed:  # the build reads its input: it is inside run_build
        feed.write("".join(f'{{"a": {i}}}\n' for i in range(5)))
        feed.flush()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
    assert "interrupted: the whole shards written so far are kept" in err, err
    command = err.rsplit("finish the build with: ", 1)[1].strip()
    assert command == f"shardkit build {raw} -o {out} --maxcount 10 --resume", command
    again = _start(*shlex.split(command)[1:])
    with open(fifo, "w") as feed:
        feed.write("".join(f'{{"a": {i}}}\n' for i in range(35)))
    _, err = again.communicate(timeout=60)
    assert again.returncode == 0, err
    assert assert_whole(out / "manifest.json").total_samples == 35


def test_a_writer_held_open_refuses_a_build_from_its_own_thread(tmp_path: Path) -> None:
    """A notebook opens a ShardWriter and then runs a build into the same folder in the
    same thread: the build was let in (the lock was re-entrant per thread) and the two
    mixed their shards and manifests; now refused, the writer's data whole."""
    out = tmp_path / "out"
    src = tmp_path / "in.jsonl"
    src.write_text("".join(f'{{"x": {i}}}\n' for i in range(20)))
    with sk.ShardWriter(out, maxcount=5) as w:
        w.write({"__key__": "k", "txt": "held"})
        with pytest.raises(WriterError, match="ShardWriter this thread holds open"):
            build([str(src)], out, progress=False)
        r = shardkit("build", src, "-o", out)  # the CLI's entry point, in this thread
        assert r.returncode == 1 and "holds open" in r.stderr, r.stderr
        with pytest.raises(WriterError, match="holds open"):
            sk.ShardWriter(out, prefix="again")
    m = assert_whole(out / "manifest.json")
    assert m.total_samples == 1 and keys_of(read_samples(m)) == ["k"]
    # a build's own lock still lends itself to the build's writer: a build runs whole
    assert build([str(src)], tmp_path / "out2", progress=False).manifest.total_samples == 20


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_writer_dropped_unclosed_lets_its_output_go(tmp_path: Path) -> None:
    """A ShardWriter garbage-collected while open (a function that raised mid-write, a
    notebook cell run again) held its lock for the life of the process: its thread was
    refused forever ('a ShardWriter this thread holds open: close it first'), with nothing
    left to close. Its lock goes with it, as a killed process's does."""
    import contextlib
    import gc

    out = tmp_path / "out"
    src = tmp_path / "in.jsonl"
    src.write_text('{"x": 1}\n')

    def write_and_fail() -> None:
        w = sk.ShardWriter(out, maxcount=5)
        w.write({"__key__": "k", "txt": "dropped"})
        raise RuntimeError("a bug mid-write")

    with contextlib.suppress(RuntimeError):  # its traceback (the writer's frame) goes
        write_and_fail()
    gc.collect()
    with sk.ShardWriter(out, overwrite=True) as w:
        w.write({"__key__": "k", "txt": "again"})
    build([str(src)], out, progress=False, overwrite=True)
    assert assert_whole(out / "manifest.json").total_samples == 1
    assert not hidden_leftovers(out)


def test_a_killed_writer_not_yet_reaped_holds_nothing() -> None:
    """A SIGKILLed build's workers are zombies for a moment (killed, not reaped): their
    pids answer kill(pid, 0), so a --resume right after the kill took their lock objects
    for a live build's and was refused (seen in a whole-suite run)."""
    from shardkit.write.writer.lock import pid_alive

    child = os.fork()
    if child == 0:
        os._exit(0)
    try:
        deadline = time.monotonic() + 3
        while pid_alive(child):  # exited, not reaped: a zombie
            assert time.monotonic() < deadline, "a zombie counted as a running process"
            time.sleep(0.01)
        assert os.waitpid(child, os.WNOHANG)[0] == child  # it was still there, unreaped
    finally:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(child, 0)
    assert pid_alive(os.getpid())
