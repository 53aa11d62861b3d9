"""Files the conductor writes: the trace, the log, transcripts, `trace html` pages.

Never through a symbolic link (one planted at the path would otherwise have its target
truncated or appended to), and owner-only whatever the umask: they hold prompts, file
contents and whatever the agent said.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import TYPE_CHECKING

from conductor.errors import ConfigError

if TYPE_CHECKING:
    from pathlib import Path

PRIVATE = 0o600


def open_output(path: str | os.PathLike[str], *, option: str, append: bool = False,
                mode: int = PRIVATE) -> int:
    """A write-only descriptor for `path`, created with exactly `mode`.

    Truncates, or with `append` appends. A regular file this truncates gets `mode` too (it
    may have existed with wider permissions); one appended to keeps its own.

    Raises:
        ConfigError: `path` is a symbolic link (refused, never followed) or cannot be
            opened; `option` (e.g. "--trace") names what gave the path.
    """
    # O_NONBLOCK: opening a FIFO nobody reads would otherwise wait for a reader, for ever
    # (it is cleared once open: writes block as usual).
    flags = os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK | \
        (os.O_APPEND if append else os.O_TRUNC)
    try:
        try:
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, mode)
            created = True
        except FileExistsError:
            fd = os.open(path, flags)  # O_NOFOLLOW: a link there fails with ELOOP
            created = False
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EMLINK) and os.path.islink(path):
            raise ConfigError(f"{os.fsdecode(path)} is a symbolic link; not writing through it",
                              field=option,
                              hint="give the path of a regular file, e.g. the link's target"
                              ) from None
        if e.errno == errno.ENXIO and _is_fifo(path):
            raise ConfigError(f"{os.fsdecode(path)} is a named pipe that nothing reads",
                              field=option,
                              hint="start its reader first, or give the path of a file"
                              ) from None
        raise ConfigError(f"cannot write {os.fsdecode(path)}: {e.strerror or e}",
                          field=option) from None
    os.set_blocking(fd, True)
    try:
        if (created or not append) and stat.S_ISREG(os.fstat(fd).st_mode):
            os.fchmod(fd, mode)  # exact: a umask of 077 must not narrow an asked-for 0644
    except OSError as e:
        os.close(fd)
        raise ConfigError(f"cannot set the mode of {os.fsdecode(path)} to {mode:o}: "
                          f"{e.strerror or e}", field=option) from None
    return fd


def refuse_overwriting(path: str | os.PathLike[str], *, option: str,
                       inputs: dict[str, str | os.PathLike[str] | None]) -> None:
    """Refuse to write `path` when it is one of `inputs` (what each is: "the chain file").

    Raises:
        ConfigError: it is (the same file, by any name): writing it would destroy it.
    """
    for what, other in inputs.items():
        try:
            same = other is not None and os.path.samefile(path, other)
        except OSError:  # either does not exist (yet): not the same file
            same = False
        if same:
            raise ConfigError(f"{os.fsdecode(path)} is {what}; writing there would destroy it",
                              field=option, hint="give another file name")


def _is_fifo(path: str | os.PathLike[str]) -> bool:
    try:
        return stat.S_ISFIFO(os.stat(path, follow_symlinks=False).st_mode)
    except OSError:
        return False


def make_private_dir(path: Path) -> None:
    """`path` and its parents, as `mkdir -p`; the last one, if created here, owner-only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        return
    os.chmod(path, 0o700)  # exactly, whatever the umask
