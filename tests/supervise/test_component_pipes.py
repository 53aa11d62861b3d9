"""A component's protocol pipes: plain fds that carry bytes both ways and are closed after."""

from __future__ import annotations

import errno
import os
import sys
from typing import TYPE_CHECKING

import anyio
import pytest

from conductor.errors import ComponentStartError
from conductor.supervise.component import open_component
from conductor.supervise.spawn import LaunchSpec

if TYPE_CHECKING:
    from pathlib import Path

ECHO = "import sys\nfor line in sys.stdin: sys.stdout.write(line.upper()); sys.stdout.flush()"


async def test_a_component_echoes_over_its_pipes_and_its_fds_are_closed_on_exit() -> None:
    spec = LaunchSpec("agent", [sys.executable, "-c", ECHO], shutdown_grace=2.0)
    with anyio.fail_after(10):
        async with open_component(spec, lambda name, line: None) as comp:
            fds = (comp.stdin._fd.fd, comp.stdout._fd.fd)  # type: ignore[attr-defined]
            pipes = {fd: os.fstat(fd).st_ino for fd in fds}
            await comp.stdin.send(b"hello\n")
            got = b""
            while not got.endswith(b"\n"):
                got += await comp.stdout.receive()
    assert got == b"HELLO\n"
    for fd, inode in pipes.items():  # closed (the number may name something else by now)
        try:
            assert os.fstat(fd).st_ino != inode
        except OSError:
            pass


async def test_running_out_of_fds_for_the_pipes_is_a_start_error_and_leaks_none(
        monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[int] = []
    real_pipe = os.pipe

    def pipe() -> tuple[int, int]:
        if len(made) == 4:  # the third pair: the process is out of fds (EMFILE)
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        r, w = real_pipe()
        made.extend((r, w))
        return r, w

    monkeypatch.setattr(os, "pipe", pipe)
    spec = LaunchSpec("agent", [sys.executable, "-c", ECHO])
    with pytest.raises(ComponentStartError, match="Too many open files"):
        async with open_component(spec, lambda name, line: None):
            pass
    for fd in made:
        with pytest.raises(OSError):
            os.fstat(fd)


@pytest.mark.parametrize(("make", "said"), [
    ("file", "{p} is not executable (hint: make it so, chmod +x {p}, or start it through its "
             "interpreter)"),
    ("folder", "{p} is a directory (hint: give the program's path)"),
])
async def test_a_program_that_cannot_be_executed_is_told_why_and_the_fix(
        tmp_path: Path, make: str, said: str) -> None:
    # It was "cannot execute PATH: Permission denied": for a folder, or a script saved without
    # its x bit, the reason and the fix were left to guess.
    path = tmp_path / "agent"
    if make == "file":
        path.write_text("#!/bin/sh\n", encoding="utf-8")
    else:
        path.mkdir()
    with pytest.raises(ComponentStartError) as refused:
        async with open_component(LaunchSpec("agent", [str(path)]), lambda name, line: None):
            pass
    assert said.format(p=path) in str(refused.value)
