"""A component's protocol pipes: plain fds that carry bytes both ways and are closed after."""

from __future__ import annotations

import os
import sys

import anyio

from conductor.supervise.component import LaunchSpec, open_component

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
