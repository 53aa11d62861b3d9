"""permissions: a declarative policy for what the agent may do through the editor.

Rules are checked in order, first match wins, else `default`. They judge
`session/request_permission` (by tool kind, title, paths, command; v1's `toolCall` and v2's
`subject` alike) and the agent's direct
requests to the editor: `fs/read_text_file`, `fs/write_text_file`, `terminal/create`. So a
`.env` rule also stops a read that goes straight through the editor's filesystem, or a
`cat .env` in a terminal. A request the policy cannot place (an unknown session, a path
that is not absolute, a NUL byte, a path through /proc) is denied without consulting the
rules. Every decision is logged with the rule, or the reason, that made it.
docs/proxies.md says exactly what path and command rules can and cannot see.
"""

from __future__ import annotations

import glob
import hashlib
import itertools
import json
import os
import re
import shlex
import unicodedata
from contextlib import suppress
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, ConfigDict, field_validator

from conductor.errors import RpcError
from conductor.jsonrpc.codes import ErrorCode
from conductor.jsonrpc.message import as_object
from conductor.plugins import Proxy, ProxyContext, WatchContext, on, watch
from conductor.spelling import did_you_mean
from conductor.validation import Regex

if TYPE_CHECKING:
    from collections.abc import Iterable

    from conductor.jsonrpc.message import JsonValue, Notification, Request

Action = Literal["allow", "deny", "ask"]
PERMISSION_DENIED = ErrorCode.POLICY_DENIED  # docs/errors.md

MAX_SYMLINKS = 40          # as Linux's ELOOP limit
MAX_WORDS = 10_000         # words of one command that are judged as paths; more is refused
MAX_GLOB_MATCHES = 256     # what one shell glob may expand to, for matching
MAX_COMMAND_CHARS = 256 * 1024  # a longer command line is refused (Linux: 128 KiB per arg)
MAX_SPELLING_CHARS = 8 * MAX_COMMAND_CHARS  # all the spellings of one command, together
MAX_DEPTH = 8              # shells within shells
MAX_DIRS = 32              # `cd`s in one command line
MAX_WRAPPED_WORDS = 256    # how far into `sudo -u x ... CMD` the wrapped command is looked for
MAX_WRAPPED_PLAIN = 16     # words after a wrapper that may start the wrapped command
MAX_TOOL_CALLS = 1024      # tool calls remembered per session (the oldest are forgotten)
FORGOTTEN_BITS = 1 << 16   # a Bloom filter of the forgotten ones' ids, per session (8 KiB)
# What an editor shows of a tool call, and rules judge: `session/update` announces them,
# and a permission request may name only the id (its toolCall is a ToolCallUpdate).
TOOL_CALL_FIELDS = ("kind", "title", "locations", "rawInput", "content")
# Paths that name a different file in each process (/proc/self/cwd, /dev/fd/3): what the
# editor would open there cannot be known here.
PER_PROCESS_ROOTS = ("/proc", "/dev/fd", "/dev/stdin", "/dev/stdout", "/dev/stderr")
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "yash", "posh",
                    "fish", "csh", "tcsh", "ksh93", "pdksh", "oksh", "loksh", "lksh",
                    # restricted shells run `-c` scripts all the same
                    "rbash", "rksh", "rzsh",
                    # Oils, BusyBox's, and shells of other syntax: a `rm -rf x` there is
                    # still a command line (pwsh's `-Command STR` is read as a word with
                    # spaces, below)
                    "osh", "ysh", "oil", "hush", "nu", "elvish", "xonsh", "pwsh",
                    "powershell", "rc", "es", "ion", "murex", "brush"})
# Programs that run their arguments as a command: `sudo rm -rf x` is judged as `rm -rf x` too.
WRAPPERS = frozenset({"sudo", "doas", "su", "env", "nice", "nohup", "time", "command", "exec",
                      "builtin", "xargs", "parallel", "find", "timeout", "stdbuf", "setsid",
                      "ionice", "chrt", "taskset", "busybox", "unbuffer", "flock", "watch",
                      "strace", "ltrace", "nsenter", "chroot", "runuser", "systemd-run",
                      "pkexec", "unshare", "setpriv", "sg", "fakeroot", "faketime", "prlimit",
                      "numactl", "cgexec", "chpst", "script", "firejail", "bwrap", "catchsegv",
                      "valgrind", "torsocks", "proxychains", "proxychains4",
                      "dbus-run-session", "xvfb-run", "tmux", "screen",
                      "noglob", "nocorrect", "-",  # zsh's precommand modifiers
                      "repeat",  # zsh's and csh's `repeat N CMD`
                      "and", "or", "not",  # fish's
                      "run0", "setarch", "linux32", "linux64", "eatmydata", "nocache",
                      "systemd-inhibit", "flatpak-spawn", "host-spawn", "sshpass",
                      "cpulimit", "trickle", "rlwrap", "daemonize",
                      "toybox", "coreutils"})  # multi-call binaries, as busybox
# Project and environment runners (`uv run CMD`, `bundle exec CMD`, `npx -c STR`): judged
# like wrappers, from each later word on, but a word with spaces is only an argument to
# them (`uv run pytest -k "a or b"`), judged as a command line for deny and ask alone.
RUNNERS = frozenset({"uv", "poetry", "pipenv", "pdm", "hatch", "rye", "conda", "mamba",
                     "micromamba", "pixi", "npx", "npm", "pnpm", "yarn", "bun", "bunx",
                     "bundle", "direnv", "mise", "asdf", "nix-shell", "nix", "devbox",
                     "gosu", "su-exec", "arch", "caffeinate", "ssh-agent", "dbus-launch",
                     "doppler", "op", "aws-vault", "hyperfine", "entr", "chronic",
                     "sandbox-exec",
                     "ssh"})  # its command may run on this host (localhost), ProxyCommand here
SHELL_KEYWORDS = frozenset({"if", "then", "else", "elif", "fi", "do", "done", "while",
                            "until", "!", "{", "}", "time", "coproc"})
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
# Variables through which a shell, the loader or the program run other code than the
# command line (a function `ls` bash imports, a startup file or its directory, a prompt
# hook, another `git` on PATH, a preloaded library, git's ssh, diff, editor or proxy
# command, git's config (whose core.fsmonitor runs for `git status`) by variable or by the
# directory it is read from, less's input filter, an interpreter's start-up options):
# no allow rule can see what runs with one set. (Not PAGER, EDITOR or PYTHONPATH: agents
# set `GIT_PAGER=cat` and `PYTHONPATH=.` for ordinary runs, and deny rules see them.)
CODE_VARIABLES = re.compile(r"BASH_FUNC_.+|BASH_ENV|ENV|ZDOTDIR|PROMPT_COMMAND|PS[0-4]"
                            r"|SHELLOPTS|BASHOPTS|PATH|LD_[A-Z_]+|DYLD_[A-Z_]+|IFS|CDPATH"
                            r"|GLOBIGNORE|GIT_SSH|GIT_SSH_COMMAND|GIT_EXEC_PATH"
                            r"|GIT_CONFIG_[A-Z0-9_]+|GIT_ASKPASS|SSH_ASKPASS|SUDO_ASKPASS"
                            r"|GIT_EXTERNAL_DIFF|GIT_EDITOR|GIT_SEQUENCE_EDITOR"
                            r"|GIT_PROXY_COMMAND|GIT_DIR|GIT_COMMON_DIR|GIT_TEMPLATE_DIR"
                            r"|HOME|XDG_CONFIG_HOME|LESSOPEN|LESSCLOSE"
                            r"|NODE_OPTIONS|PERL5OPT|RUBYOPT|JAVA_TOOL_OPTIONS|_JAVA_OPTIONS")
_OPERATOR_CHARS = frozenset(";&|()<>")
# What `> FILE` may write to and still be no file written (`2>&1` duplicates, `>&-` closes)
QUIET_FILES = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})
_OPERATOR = re.compile(r"([;&|()]*?)(&?[<>].*)?")  # (command ends, then a redirection)


# ACP's ToolKind (v1 and v2 schemas); v2 also lets an agent send its own, spelt `_...`.
TOOL_KINDS = ("read", "edit", "delete", "move", "search", "execute", "think", "fetch",
              "switch_mode", "other")


class Rule(BaseModel):
    """One rule: every condition given must match; a rule with none matches everything."""

    model_config = ConfigDict(extra="forbid")

    action: Action
    name: str | None = None                 # shown in the log; default "rule N"
    kind: str | list[str] | None = None     # tool kind: read, edit, delete, execute, fetch, ...
    title: str | None = None                # glob on the tool call's title
    path: str | None = None                 # glob on any path involved (see docs)
    command: Regex | None = None            # regex searched in the command line

    @field_validator("kind")
    @classmethod
    def _known_kinds(cls, value: str | list[str] | None) -> str | list[str] | None:
        # A misspelt kind (`exec`, `Edit`) makes the rule match nothing: a deny that never
        # denies, found out only when it mattered. A word near no kind may be one a later
        # ACP adds (v2 reserves them): that is only warned of (`unknown_kinds`).
        for kind in [value] if isinstance(value, str) else value or []:
            if kind not in TOOL_KINDS and not kind.startswith("_") \
                    and (hint := did_you_mean(kind, TOOL_KINDS)) is not None:
                raise ValueError(f"{kind!r} is not an ACP tool kind ({hint}); the kinds are "
                                 f"{', '.join(TOOL_KINDS)} (and an agent's own, `_name`)")
        return value

    def unknown_kinds(self) -> list[str]:
        """Its kinds that ACP does not name today (nor as an agent's own, `_name`)."""
        kinds = [self.kind] if isinstance(self.kind, str) else self.kind or []
        return [k for k in kinds if k not in TOOL_KINDS and not k.startswith("_")]


class PermissionsOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rules: list[Rule] = []
    default: Action = "ask"


class Unplaceable(Exception):
    """The policy cannot tell which file or command a request means: it is denied."""


# -- paths ---------------------------------------------------------------------------------

def _lexical(path: str) -> str:
    """An absolute path with `//`, `.`, `..` and a trailing `/` folded, without the disk."""
    parts: list[str] = []
    for part in path.split("/"):
        if part == "..":
            if parts:
                parts.pop()
        elif part not in ("", "."):
            parts.append(part)
    return "/" + "/".join(parts)


def _per_process(path: str) -> bool:
    return any(path == root or path.startswith(root + "/") for root in PER_PROCESS_ROOTS)


def _proc_link(todo: list[str]) -> str | None:
    """After `/proc`: `root` or `cwd` when the next components of `todo` (a stack) are
    `PID/root`, `PID/cwd` or `PID/task/TID/...`, taken off the stack; otherwise None."""
    names: list[int] = []
    for i in range(len(todo) - 1, -1, -1):
        if todo[i] not in ("", "."):
            names.append(i)
            if len(names) == 4:
                break
    parts = [todo[i] for i in names]
    for length in (2, 4):
        if len(parts) >= length and parts[length - 1] in ("root", "cwd") \
                and ".." not in parts[:length - 1] \
                and (length == 2 or parts[1] == "task"):
            del todo[names[length - 1]:]
            return parts[length - 1]
    return None


def resolve(path: str, *, proc_cwd: str | None = None) -> str:
    """The absolute `path` with every symlink followed in order, as the kernel does
    (`link/..` is the parent of the link's target); missing parts are kept as written.
    With `proc_cwd` (a command's directory), `/proc/PID/root` is taken for `/` and
    `/proc/PID/cwd` for `proc_cwd`, as they are for the process the command starts.

    Raises:
        Unplaceable: a symlink loop, or (otherwise) a way through /proc or /dev/fd.
    """
    done = "/"
    todo = path.split("/")[::-1]  # a stack: the next component is last
    links = 0
    while todo:
        part = todo.pop()
        if part in ("", "."):
            continue
        if part == "..":
            done = os.path.dirname(done)
            continue
        candidate = os.path.join(done, part)
        if _per_process(candidate):
            link = _proc_link(todo) if proc_cwd is not None and candidate == "/proc" \
                else None
            if link is not None:
                links += 1  # a jump like a link's: loops through it end at the limit
                if links > MAX_SYMLINKS:
                    raise Unplaceable(f"{path}: too many levels of symbolic links")
                done = "/"
                if link == "cwd" and proc_cwd is not None:
                    todo.extend(proc_cwd.split("/")[::-1])
                continue
            raise Unplaceable(f"{path} goes through {candidate}, which names a different "
                              "file in each process")
        try:
            target = os.readlink(candidate)
        except OSError:  # not a link, missing, or not ours to read: taken as written
            done = candidate
            continue
        links += 1
        if links > MAX_SYMLINKS:
            raise Unplaceable(f"{path}: too many levels of symbolic links")
        if target.startswith("/"):
            done = "/"
        todo.extend(target.split("/")[::-1])
    return done


def _spellings(full: str, bases: Iterable[str]) -> set[str]:
    """`full` (absolute, folded), relative to each base it lies under, and its file name."""
    names = {full, os.path.basename(full)}
    for base in bases:
        if full == base:
            names.add(".")
        elif full.startswith(base.rstrip("/") + "/"):
            names.add(full[len(base.rstrip("/")) + 1:])
    names.discard("")
    return names


@dataclass(frozen=True)
class Place:
    """Every name one path goes by. `names`: what any spelling of it reads as (lexical and
    real, absolute and relative to the cwd, file names); `targets`: the names of each file
    the request could actually reach (None when that cannot be known)."""

    shown: str
    names: frozenset[str]
    targets: tuple[frozenset[str], ...] | None


class Placer:
    """Places paths for one request: its session `cwd` (and that resolved) are the bases
    of the relative spellings."""

    def __init__(self, cwd: str | None) -> None:
        self.cwd = cwd
        self.bases = {_lexical(cwd)} if cwd else set()
        self.error: Unplaceable | None = None
        if cwd:
            try:
                self.bases.add(resolve(cwd))
            except Unplaceable as e:
                self.error = e

    def place(self, path: str, *, base: str | None = None, strict: bool = True) -> Place:
        """Where `path` (absolute, or relative to `base`, by default the session's cwd)
        leads. With `strict`, a path the policy cannot judge raises; otherwise (a word in
        a command, which may not be a path at all) it keeps only its lexical names.

        Raises:
            Unplaceable: a NUL byte; with `strict`, a loop or a way through /proc or /dev/fd.
        """
        if "\0" in path:
            raise Unplaceable(f"{path!r} has a NUL byte")
        base = base or self.cwd
        if os.path.isabs(path):
            raw = path
        elif base is not None:
            raw = f"{base}/{path}"
        else:  # only path_matches asks this: match the lexical spelling as it stands
            folded = os.path.normpath(path)
            return Place(path, frozenset({folded, os.path.basename(folded)}), None)
        lexical = _lexical(raw)
        try:
            if self.error is not None:
                raise self.error
            # The kernel follows `link/..` through the link; an editor that normalises
            # first does not: either file may be the one opened.
            reached = {resolve(raw), resolve(lexical)}
        except Unplaceable:
            if strict:
                raise
            names = _spellings(lexical, self.bases)
            if self.error is None and base is not None:
                # A command's own /proc/self/root or /proc/self/cwd: judged as the file
                # it reaches there (for deny and ask only: another PID's may differ).
                try:
                    names |= _spellings(resolve(raw, proc_cwd=base), self.bases)
                except Unplaceable:
                    pass
            return Place(path, frozenset(names), None)
        names = _spellings(lexical, self.bases)
        targets = tuple(frozenset(_spellings(r, self.bases)) for r in sorted(reached))
        for target in targets:
            names |= target
        return Place(path, frozenset(names), targets)


def place(path: str, cwd: str | None, *, strict: bool = True) -> Place:
    """`Placer(cwd).place(path)`. Raises:
        Unplaceable: see `Placer.place`.
    """
    return Placer(cwd).place(path, strict=strict)


def path_matches(pattern: str, path: str, cwd: str | None) -> bool:
    """Does a deny or ask rule's glob match any spelling of `path` (see `place`)?"""
    return _glob_any(pattern, [place(path, cwd, strict=False)])


def _folded(text: str) -> str:
    """`text` without case or Unicode normalisation (NFD of the case fold)."""
    return unicodedata.normalize("NFD", unicodedata.normalize("NFD", text).casefold())


def _glob_any(pattern: str, places: list[Place]) -> bool:
    # Deny and ask fold case and normalisation: `.ENV` is the same file as `.env` on a
    # case-insensitive filesystem (macOS, Windows), `cafe\u0301` as `caf\u00e9` on macOS's,
    # and realpath fixes neither there.
    folded = _folded(pattern)
    return any(fnmatchcase(_folded(name), folded) for p in places for name in p.names)


def _glob_all(pattern: str, places: list[Place]) -> bool:
    # Allow judges the file reached, not the name it was asked by: every file every path
    # could reach must match, case and all.
    return bool(places) and all(
        p.targets is not None
        and all(any(fnmatchcase(name, pattern) for name in t) for t in p.targets)
        for p in places)


def absolute_path(value: object, what: str) -> str:
    """A path ACP requires to be absolute, checked.

    Raises:
        Unplaceable: not a non-empty string, not absolute, or with a NUL byte.
    """
    if not isinstance(value, str) or not value:
        raise Unplaceable(f"{what} is not a path: {value!r}")
    if "\0" in value:
        raise Unplaceable(f"{what} {value!r} has a NUL byte")
    if not os.path.isabs(value):
        raise Unplaceable(f"{what} must be absolute (ACP), got {value!r}")
    return value


# -- commands ------------------------------------------------------------------------------

@dataclass
class Command:
    """A command line as rules see it."""

    line: str                                    # as sent: command and arguments, joined
    simple: list[str] = field(default_factory=list)       # every simple command, normalised
    unwrapped: list[str] = field(default_factory=list)    # what wrappers would run, shells
    #   seen through: spellings for deny and ask rules only
    words: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)  # (word, bases)
    opaque: bool = False    # parts no rule can see through: expansions, scripts, stdin
    home: str | None = None  # the HOME the command is given (terminal/create's env)
    aliases: dict[str, str] = field(default_factory=dict)  # `alias NAME=VALUE`s seen so far
    budget: int = MAX_SPELLING_CHARS
    placements: int = 0

    def spellings(self) -> list[str]:
        return [self.line, *self.simple, *self.unwrapped]

    def add_words(self, words: list[str], bases: tuple[str, ...]) -> None:
        """Words that may be paths, each to be tried against every base. Raises:
            Unplaceable: more than MAX_WORDS placements in one command.
        """
        self.words.extend((w, bases) for w in words)
        self.placements += len(words) * max(len(bases), 1)
        if self.placements > MAX_WORDS:
            raise Unplaceable(f"the command has more than {MAX_WORDS} words to judge")

    def spell(self, into: list[str], argv: list[str], *, exact: bool = False) -> None:
        """Add `argv` as a spelling (the program by its base name, unless `exact`). Raises:
            Unplaceable: the spellings of one command would exceed MAX_SPELLING_CHARS.
        """
        text = " ".join(argv) if exact else _spelled(argv)
        self.budget -= len(text)
        if self.budget < 0:
            raise Unplaceable("the command is too complex to judge")
        into.append(text)


def command_of(argv: list[str], cwd: str | tuple[str, ...] | None, *,
               script: str | None = None, home: str | None = None) -> Command:
    """Parse an argv (and `script`, a command line an editor may hand to a shell), run in
    `cwd` (or in any one of several); `home` is the HOME its environment sets, if any.

    Raises:
        Unplaceable: a NUL byte, too long, too many words, or nested too deep to judge.
    """
    pieces = [*argv, *([script] if script is not None else [])]
    if any("\0" in p for p in pieces):
        raise Unplaceable("the command has a NUL byte")
    if sum(map(len, pieces)) > MAX_COMMAND_CHARS:
        raise Unplaceable(f"the command is longer than {MAX_COMMAND_CHARS} characters")
    command = Command(" ".join(argv), home=home)
    bases = (cwd,) if isinstance(cwd, str) else cwd or ()
    _add_argv(command, argv, bases, in_shell=False, depth=0)
    if script is not None:
        _add_script(command, script, bases, depth=0)
    return command


def _spelled(argv: list[str]) -> str:
    return " ".join([os.path.basename(argv[0]) or argv[0], *argv[1:]])


def _add_argv(command: Command, argv: list[str], bases: tuple[str, ...], *, in_shell: bool,
              depth: int) -> None:
    while argv and (argv[0] in SHELL_KEYWORDS or _ASSIGNMENT.match(argv[0])):
        if _ASSIGNMENT.match(argv[0]):
            _add_variable(command, argv[0], bases, depth)
            # `F=.env; cat $F`: the value may be the file a later `$F` opens
            command.add_words(_path_words(argv[0], bases, in_shell, command.home), bases)
        if argv[0] == "time" and argv[1:2] and argv[1].startswith("-"):
            break  # `time -p CMD`, `time -f FMT CMD`: judged as a wrapper, options and all
        if argv[0] == "coproc" and len(argv) > 2:
            # `coproc NAME { ...; }` runs the body after the name (and `coproc CMD` CMD)
            _add_body(command, argv[2:], bases, in_shell, depth)
        argv = argv[1:]
    if argv[:1] == ["function"] and len(argv) > 2:  # `function NAME { ...; }`: the body
        _add_body(command, argv[2:], bases, in_shell, depth)
    if not argv:
        return
    if len(argv) > MAX_WORDS:
        raise Unplaceable(f"the command has more than {MAX_WORDS} words to judge")
    if "/" in argv[0]:
        # `./git status` runs that file, which an allow rule for `git` never saw: it is
        # judged with its path; by its base name (`/bin/rm` is `rm`) for deny and ask
        command.spell(command.simple, argv, exact=True)
        command.spell(command.unwrapped, argv)
    else:
        command.spell(command.simple, argv)
    for i, word in enumerate(argv):
        if i == 0 and "/" not in word:
            continue  # a program found on PATH is not a path here
        command.add_words(_path_words(word, bases, in_shell, command.home), bases)
    _look_inside(command, argv, bases, depth)


def _add_variable(command: Command, assignment: str, bases: tuple[str, ...],
                  depth: int) -> None:
    """A variable the command runs with (`NAME=value`). One that runs code makes the
    command opaque; a value with spaces may be a command (an imported function's body, a
    prompt hook), so it is judged as a script too, for deny and ask rules.

    Raises:
        Unplaceable: values in values nested more than MAX_DEPTH deep.
    """
    name, value = assignment.split("=", 1)
    if any(c.isspace() for c in value):
        # Read as a script only for its spellings: an ordinary variable's value is data
        # (`NAME="Conan O'Brien"`), and what cannot be parsed in it runs nowhere.
        _add_spellings(command, value, bases, depth)
    if CODE_VARIABLES.fullmatch(name):
        command.opaque = True


def _add_spellings(command: Command, text: str, bases: tuple[str, ...], depth: int) -> None:
    """`text`, which may be data or a command line, judged as a script for deny and ask
    rules only: what it adds to `simple` goes to `unwrapped`, and it makes nothing opaque.

    Raises:
        Unplaceable: nested more than MAX_DEPTH deep.
    """
    if depth >= MAX_DEPTH:
        raise Unplaceable(f"the command nests shells more than {MAX_DEPTH} deep")
    before, opaque = len(command.simple), command.opaque
    _add_script(command, text, bases, depth + 1)
    command.unwrapped.extend(command.simple[before:])
    del command.simple[before:]
    command.opaque = opaque


def _add_body(command: Command, argv: list[str], bases: tuple[str, ...], in_shell: bool,
              depth: int) -> None:
    """Raises:
        Unplaceable: bodies nested more than MAX_DEPTH deep (`coproc a coproc a ...`).
    """
    if depth >= MAX_DEPTH:
        raise Unplaceable(f"the command nests shells more than {MAX_DEPTH} deep")
    _add_argv(command, argv, bases, in_shell=in_shell, depth=depth + 1)


def _look_inside(command: Command, argv: list[str], bases: tuple[str, ...],
                 depth: int) -> None:
    """What a shell (`sh -c SCRIPT`) or a wrapper (`sudo -u x CMD`) would run.

    Raises:
        Unplaceable: shells nested too deep, or a wrapped command too far in to find.
    """
    if depth >= MAX_DEPTH:
        raise Unplaceable(f"the command nests shells more than {MAX_DEPTH} deep")
    program = os.path.basename(argv[0])
    if program == "eval":  # its arguments, joined, are a script
        command.opaque = True
        _add_script(command, " ".join(argv[1:]), bases, depth + 1)
        return
    if program == "trap":  # `trap [--] HANDLER SIGNAL...`: the handler is a script
        handler = argv[2:3] if argv[1:2] == ["--"] else argv[1:2]
        command.opaque = True
        for body in handler:
            _add_script(command, body, bases, depth + 1)
        return
    if program.startswith("=") and len(program) > 1:
        # zsh expands `=rm` to rm's path: judged as rm too (deny and ask)
        command.spell(command.unwrapped, [program[1:], *argv[1:]])
    if program in SHELLS:
        script = _shell_script(argv)
        if script is None:
            command.opaque = True  # a script file or stdin: unseen
            for word in argv[1:]:  # unless an option this parser missed hid the -c
                if any(c.isspace() for c in word):
                    for script in _scripts_in(word):
                        _add_script(command, script, bases, depth + 1)
        else:
            # Seen through: what runs is the script's commands, not `sh -c ...` itself
            # (kept for deny and ask rules all the same).
            if command.simple and command.simple[-1] in (_spelled(argv), " ".join(argv)):
                command.unwrapped.append(command.simple.pop())
            _add_script(command, script, bases, depth + 1)
        return
    if program not in WRAPPERS and program not in RUNNERS:
        return
    # Options and their values come first and differ per wrapper: every later word could
    # be where the wrapped command starts, so each suffix is judged (wrappers nest).
    plain = 0
    for i, word in enumerate(argv[1:], start=1):
        if i > MAX_WRAPPED_WORDS:
            raise Unplaceable(f"no command found in the first {MAX_WRAPPED_WORDS} words "
                              f"after {program}")
        if any(c.isspace() for c in word) and program in RUNNERS:  # `npx -c STR`
            for script in _scripts_in(word):
                _add_spellings(command, script, bases, depth)
        elif any(c.isspace() for c in word):  # `su -c STR`, `env -S STR`, `watch STR`
            command.opaque = True
            for script in _scripts_in(word):
                _add_script(command, script, bases, depth + 1)
        if _ASSIGNMENT.match(word):  # `env NAME=value CMD`
            _add_variable(command, word, bases, depth)
            continue
        if word.startswith("-"):
            continue
        command.spell(command.unwrapped, argv[i:])
        inner = os.path.basename(word)
        if inner in SHELLS:
            _look_inside(command, argv[i:], bases, depth + 1)
        elif inner not in WRAPPERS and inner not in RUNNERS:
            plain += 1
            if plain >= MAX_WRAPPED_PLAIN:
                return


# rawInput fields (compared in lower case) that name the directory a tool runs in
RAW_INPUT_DIRS = frozenset({"cwd", "workdir", "working_dir", "working_directory",
                            "workingdirectory", "directory", "dir", "dir_path",
                            "cd"})  # Zed's terminal tool
RAW_INPUT_COMMANDS = ("command", "cmd", "argv")  # rawInput fields that hold the command
RAW_INPUT_GLOBS = frozenset({"glob", "include", "includes"})  # a search tool's file filter
# rawInput fields that name files: `path`, `file_path`, `paths`; Cursor's `target_file`,
# `files`; a move's `source` and `destination`
RAW_INPUT_PATH_ENDINGS = ("path", "paths", "file", "files", "filename", "filenames")
RAW_INPUT_PATHS = frozenset({"source", "destination", "src", "dst", "dest"})


def _names_paths(key: str) -> bool:
    return key.lower().endswith(RAW_INPUT_PATH_ENDINGS) or key.lower() in RAW_INPUT_PATHS
MAX_CLUSTER = 8  # short options run together before an option's value: `-qcSCRIPT`


def _scripts_in(word: str) -> list[str]:
    """What a word with spaces may hand a wrapper as a command line: itself, or, as an
    option's value run together with it, what follows `--opt=` (`su --command=STR`,
    `env --split-string=STR`) or the letters of `-cSTR` and `-qcSTR` (`env -SSTR`)."""
    scripts = [word]
    head = re.split(r"\s", word, maxsplit=1)[0]
    if head.startswith("--") and "=" in head:
        scripts.append(word.split("=", 1)[1])
    elif head.startswith("-"):
        scripts.extend(word[i:] for i in range(2, min(len(head), MAX_CLUSTER + 2)))
    return scripts


def _shell_script(argv: list[str]) -> str | None:
    """The script of `sh -c SCRIPT` (`-ec`, `-lc`, `-o pipefail -c` ...), else None."""
    wants_script = False
    words = iter(argv[1:])
    for word in words:
        if word == "--":
            continue
        if word[:1] in "-+" and len(word) > 1:
            if word in ("-o", "+o", "-O", "+O", "--rcfile", "--init-file"):
                next(words, None)
            elif not word.startswith("--") and "c" in word[1:]:
                wants_script = True
            continue
        return word if wants_script else None
    return None


# A backslash-newline that is not itself escaped (after an even run of backslashes).
_CONTINUATION = re.compile(r"(?<!\\)((?:\\\\)*)\\\n")
_BASH_QUOTED = re.compile(r"""\$'((?:[^'\\]|\\.)*)'|\$(?=")""", re.DOTALL)
_C_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{1,2}|u[0-9a-fA-F]{1,4}|U[0-9a-fA-F]{1,8}|[0-7]{1,3}"
                       r"|c.|.)", re.DOTALL)
_NUMERIC_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]|u[0-9a-fA-F]|U[0-9a-fA-F]|[0-7])")
_C_SIMPLE = {"a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f", "n": "\n",
             "r": "\r", "t": "\t", "v": "\v"}


def _c_escape(m: re.Match[str]) -> str:
    code = m.group(1)
    if code[0] in "xuU" and len(code) > 1:
        point = int(code[1:], 16)
    elif code[0] in "01234567":
        point = int(code, 8) & 0xFF
    elif code[0] == "c" and len(code) > 1:
        point = ord(code[1]) & 0x1F
    else:
        return _C_SIMPLE.get(code, code)
    # bash ends the string at a NUL; a surrogate or beyond is no file name character
    return "" if point == 0 else chr(point) if point < 0xD800 or 0xE000 <= point <= 0x10FFFF \
        else "?"


def _bash_unquoted(script: str) -> str:
    """`script` with bash's `$'...'` (ANSI-C escapes decoded) and `$"..."` turned into
    plain quotes, so `$'rm' -rf` and `$'\\x72m' -rf` are seen as `rm -rf`. A `$'` inside
    single quotes is decoded too: this is one more spelling for deny rules, never the
    only one."""
    def plain(m: re.Match[str]) -> str:
        if m.group(1) is None:
            return ""  # `$"..."`: a translated string is the string itself
        return shlex.quote(_C_ESCAPE.sub(_c_escape, m.group(1)))
    return _BASH_QUOTED.sub(plain, script)


def _substitutions(script: str) -> list[str]:
    """The body of each outermost `$(...)` and `` `...` `` in `script`, wherever it stands:
    one in double quotes or a here-document runs too (in single quotes it does not, but
    `sh -c '...'` runs it later). In one pass: a body runs to its matching `)` (or the
    end), and a backquote's to the next unescaped backquote."""
    bodies: list[str] = []
    i, n = 0, len(script)
    while i < n:
        if script.startswith("$(", i):
            depth, j = 1, i + 2
            while j < n and depth:
                depth += {"(": 1, ")": -1}.get(script[j], 0)
                j += 1
            bodies.append(script[i + 2:j - 1 if depth == 0 else n])
            i = j
        elif script[i] == "`" and (i == 0 or script[i - 1] != "\\"):
            j = i + 1
            while j < n and (script[j] != "`" or script[j - 1] == "\\"):
                j += 1
            bodies.append(script[i + 1:j])
            i = j + 1
        else:
            i += 1
    return bodies


_WORD_BREAKS = frozenset(" \t\n;&|()<>")
# zsh's glob qualifiers that run code: `*(e:CODE:)` (any delimiter, or a bracket pair)
# and `*(+CODE)`, after any other qualifiers (`*(.Ne[CODE])`)
_ZSH_QUALIFIER = re.compile(r"\S*?(?:e([^\w\s])|\+())(.*)", re.DOTALL)
_CLOSERS = {"(": ")", "[": "]", "{": "}", "<": ">"}


def _without_comments(script: str) -> str:
    """`script` without its comments, as a shell reads them: from a `#` that starts a word,
    outside quotes, to the end of the line, or to a `;` (a script inside a script had its
    newlines read as `;`, below: ending there too reveals more, never less). In one pass."""
    out: list[str] = []
    quote = ""
    word_start = True
    i, n = 0, len(script)
    ends = {"\n": -1, ";": -1}  # the next of each at or after i, found once each (linear)
    while i < n:
        c = script[i]
        if c == "\\" and quote != "'":  # an escaped character, kept with its backslash
            out.append(script[i:i + 2])
            i, word_start = i + 2, False
            continue
        if quote:
            quote = "" if c == quote else quote
        elif c == "#" and word_start:
            for end, at in ends.items():
                if at < i:
                    found = script.find(end, i)
                    ends[end] = n if found < 0 else found
            i = min(ends.values())
            continue
        elif c in "'\"":
            quote = c
        out.append(c)
        word_start = not quote and c in _WORD_BREAKS
        i += 1
    return "".join(out)


def _add_script(command: Command, script: str, bases: tuple[str, ...], depth: int) -> None:
    if "$" in script or "`" in script or "<<" in script:
        command.opaque = True  # values only the running shell knows
    if "#" in script:
        # The lexer below takes no `#` for a comment (shlex would end `a#b` there), so a
        # quote in a comment would hide the rest (`echo x #'` newline `rm -rf x`): the
        # script without its comments is one more spelling.
        uncommented = _without_comments(script)
        if uncommented != script:  # for deny and ask: a `;` in a comment ends it here
            _add_spellings(command, uncommented, bases, depth)
    if "$(" in script or "`" in script:
        # shlex keeps a quoted `"$(rm -rf x)"` as one word: each body is judged as a
        # script of its own as well (for deny and ask: the command is opaque to allow)
        for body in _substitutions(script):
            if depth >= MAX_DEPTH:
                raise Unplaceable(f"the command nests shells more than {MAX_DEPTH} deep")
            _add_script(command, body, bases, depth + 1)
    if "\\\n" in script:
        # A shell drops `\<newline>` before it splits words (`r\<newline>m -rf` is `rm -rf`);
        # one more spelling, so a `\<newline>` inside single quotes, which stays, is judged
        # as written too.
        joined = _CONTINUATION.sub(r"\1", script)
        if joined != script and not _CONTINUATION.search(joined):  # none left to join
            _add_script(command, joined, bases, depth)
    for word in _extglob_words(script):
        command.add_words(_path_words(word, bases, True, command.home), bases)
    if "\\" in script and _NUMERIC_ESCAPE.search(script):
        # fish decodes `\x72m` to `rm` outside quotes too: one more spelling, for deny
        # and ask (what it decodes to is not decoded again, as fish does not)
        decoded = _C_ESCAPE.sub(_c_escape, script)
        if not _NUMERIC_ESCAPE.search(decoded):
            _add_spellings(command, decoded, bases, depth)
    if "$'" in script or '$"' in script:
        unquoted = _bash_unquoted(script)
        if "$'" not in unquoted and '$"' not in unquoted:  # an escape cannot spell another
            _add_script(command, unquoted, bases, depth)
    # Newlines and backquotes separate commands too; a `#` is not taken for a comment
    # (shlex would hide `a#b; rm -rf x` from the rules). A backquote is read as `)`: either
    # one may close a substitution (below).
    lexer = shlex.shlex(script.replace("\n", ";").replace("`", ")"), posix=True,
                        punctuation_chars=";&|()<>")
    lexer.whitespace_split = True
    lexer.commenters = ""
    try:
        tokens = list(lexer)
    except ValueError:  # an unclosed quote: the raw line is all rules can see
        command.opaque = True
        return
    current: list[str] = []
    dirs = list(bases)
    redirect = ""  # the redirection operator whose file is the next token
    reopened = False  # after `$(...)` or `<(...)`: the words may be the outer command's
    opened = False  # the token follows a `(`: it may be a zsh glob's qualifiers
    for token in [*tokens, ";"]:
        if token and set(token) <= _OPERATOR_CHARS:
            # shlex runs operators together: `;<` is `;` then `<`, `)>` is `)` then `>`
            # (but `&>` and `>&` are redirections, `|&` a pipe).
            split = _OPERATOR.fullmatch(token)
            assert split is not None  # every run of operator characters matches
            ends, redirection = split.group(1), split.group(2) or ""
            if redirection.endswith("("):  # `<(cmd)`, `>(cmd)`: a command, not a file
                ends, redirection, redirect = ends + "(", "", ""
            if ends:
                _simple(command, current, dirs, depth, reopened=reopened)
                current = []
                reopened = set(ends) == {")"}  # `)` alone: the command may go on
                if ends.endswith("("):
                    opened = True
            if redirection:
                if current and current[-1].isdigit():
                    current.pop()  # the fd of `2>`
                redirect = redirection
            continue
        if redirect:  # the file of `> out` or `< .env` is a path the command touches
            command.add_words(_path_words(token, dirs, True, command.home), tuple(dirs))
            if ">" in redirect and token not in QUIET_FILES \
                    and not (redirect.endswith("&") and (token.isdigit() or token == "-")):
                # `git status > ~/.bashrc` writes what no allow rule for `git status` saw
                command.opaque = True
            program = [w for w in current if not _ASSIGNMENT.match(w)][:1]
            if redirect.endswith("<<<") and program \
                    and os.path.basename(program[0]) in SHELLS:
                # `bash <<< 'rm -rf x'`: the here-string is the shell's script
                if depth >= MAX_DEPTH:
                    raise Unplaceable(f"the command nests shells more than {MAX_DEPTH} deep")
                _add_script(command, token, tuple(dirs), depth + 1)
            redirect = ""
            continue
        if opened:
            opened = False
            qualifier = _ZSH_QUALIFIER.match(token)
            if qualifier:  # `ls *(e:'rm -rf x':)`: zsh runs it for each file matched
                delimiter, body = qualifier.group(1) or "", qualifier.group(3)
                closer = _CLOSERS.get(delimiter, delimiter)
                _add_spellings(command, body[:-1] if closer and body.endswith(closer)
                               else body, tuple(dirs), depth)
        current.append(token)


# bash's extended globs (`shopt -s extglob`, `bash -O extglob`): `.@(env)` is `.env`; and
# zsh's groups, which need no operator: `.e(n|x)v` is `.env`. The
# parts of the word around one are found from it, in at most PATH_MAX characters: a regex
# for the whole word would backtrack quadratically over a long command.
_EXTGLOB = re.compile(r"([?*+@!]?)\(([^()\s]*)\)")
_WORD_AFTER = re.compile(r"""[^\s;&|()<>'"]*""")
PATH_MAX = 4096


def _extglob_words(script: str) -> list[str]:
    """What each extended glob in `script` could name, as plain globs: one per
    alternative (and none for `?(...)` and `*(...)`); `!(...)` and repeats as `*`; a zsh
    group `(...)` as one of its alternatives."""
    out: list[str] = []
    for m in itertools.islice(_EXTGLOB.finditer(script), MAX_GLOB_MATCHES):
        op, body = m.groups()
        # the word before, read backwards (a search ending at `\Z` would backtrack)
        before = _WORD_AFTER.match(script[max(0, m.start() - PATH_MAX):m.start()][::-1])
        after = _WORD_AFTER.match(script, m.end(), m.end() + PATH_MAX)
        pre = before.group()[::-1] if before else ""
        post = after.group() if after else ""
        alts = body.split("|") if op != "!" else []
        alts += [""] if op in ("?", "*") else []
        alts += ["*"] if op in ("*", "+", "!") else []
        out.extend(pre + alt + post for alt in alts)
    return out


def _simple(command: Command, argv: list[str], dirs: list[str], depth: int, *,
            reopened: bool = False) -> None:
    if reopened:  # `cat $(true) .env`: `.env` is cat's argument, not a program
        for word in argv:
            command.add_words(_path_words(word, dirs, True, command.home), tuple(dirs))
    _add_argv(command, argv, tuple(dirs), in_shell=True, depth=depth)
    if any("{" in w for w in argv):
        # bash and zsh expand braces before the command runs (`{rm,-rf,x}` is `rm -rf x`):
        # what runs is one more simple command, which an allow rule must match too
        expanded = [alt for w in argv for alt in _braces(w)]
        if expanded != argv:
            _add_body(command, expanded, tuple(dirs), True, depth)
    words = [w for w in argv if not _ASSIGNMENT.match(w)]
    while words and (words[0] in SHELL_KEYWORDS or words[0] in ("builtin", "command")):
        words = words[1:]  # `if cd secrets; then cat k`: the `cd` still changes directory
    if words[:1] == ["alias"]:
        for word in argv[argv.index("alias") + 1:]:  # `x=rm` looks like an assignment
            if "=" in word:
                name, value = word.split("=", 1)
                command.aliases[name] = value
    elif words and words[0] in command.aliases:
        # zsh expands aliases in scripts (bash with `shopt -s expand_aliases`): `x -rf y`
        # after `alias x=rm` runs `rm -rf y`; not again inside its own value, as the shells
        value = command.aliases.pop(words[0])
        try:
            _add_spellings(command, f"{value} {shlex.join(words[1:])}", tuple(dirs), depth)
        finally:
            command.aliases[words[0]] = value
    if words[:1] in (["cd"], ["pushd"]):
        # `cd -P DIR`, `cd -- DIR`: options come before the directory (`--` ends them)
        rest = list(itertools.dropwhile(lambda w: w.startswith("-") and w not in ("-", "--"),
                                        words[1:]))
        rest = rest[1:] if rest[:1] == ["--"] else rest
        if not rest and words[0] == "pushd":
            return
        # Later relative paths may be relative to it, or not (it was in a subshell, or
        # failed): both count. A bare `cd` goes home.
        target = rest[0] if rest else "~"
        for where in _homes(target, command.home, dirs) if target.startswith("~") \
                else [target]:
            if len(dirs) >= MAX_DIRS:
                raise Unplaceable(f"the command changes directory more than {MAX_DIRS} "
                                  "times")
            dirs.append(os.path.join(dirs[-1] if dirs else "/", where))


def _homes(word: str, home: str | None, bases: Iterable[str] = ()) -> list[str]:
    """`~`, `~/x` or `~user/x` expanded: by the conductor's idea of that home, and by the
    HOME the command is given; `~+` (the shell's PWD) and `~-` (its OLDPWD) as each of
    `bases`, the directories the command may be in."""
    if word[1:2] in ("+", "-") and word[2:3] in ("", "/"):
        return [base + word[2:] for base in bases]
    out = [os.path.expanduser(word)]
    if home is not None and (word == "~" or word.startswith("~/")):
        out.append(home + word[1:])
    return out


_PATCH_FILE = re.compile(r"^\*\*\* (?:(?:Add|Update|Delete) File|Move to): ?(.*)$",
                         re.MULTILINE)
_SEQUENCE = re.compile(r"(-?\d+)\.\.(-?\d+)|(.)\.\.(.)")
EXPANDING = frozenset("*?[{$")  # a word with one may name other files once expanded


def _brace_group(word: str) -> tuple[int, int, list[str]] | None:
    """The first brace group to close in `word` that bash would expand (`{a,b}`, `{1..3}`,
    `{d..f}`): where it starts and ends, and its alternatives. In one pass."""
    stack: list[tuple[int, list[int]]] = []  # each open `{` and the commas directly in it
    for j, c in enumerate(word):
        if c == "{":
            stack.append((j, []))
        elif c == "," and stack:
            stack[-1][1].append(j)
        elif c == "}" and stack:
            start, commas = stack.pop()
            if commas:
                edges = [start, *commas, j]
                return start, j, [word[a + 1:b] for a, b in itertools.pairwise(edges)]
            seq = _SEQUENCE.fullmatch(word, start + 1, j)
            if seq and seq.group(1) is not None:
                a, b = int(seq.group(1)), int(seq.group(2))
                step = 1 if b >= a else -1
                return start, j, [str(n) for n in itertools.islice(
                    range(a, b + step, step), MAX_GLOB_MATCHES)]
            if seq:
                a, b = ord(seq.group(3)), ord(seq.group(4))
                step = 1 if b >= a else -1
                return start, j, [chr(n) for n in itertools.islice(
                    range(a, b + step, step), MAX_GLOB_MATCHES)]
    return None


def _braces(word: str) -> list[str]:
    """`word` after bash's brace expansion (`.e{n,}v` is `.env` and `.ev`): at most
    MAX_GLOB_MATCHES words, of a word no longer than PATH_MAX."""
    if "{" not in word or len(word) > PATH_MAX:
        return [word]
    out: list[str] = []
    todo, steps = [word], 0
    while todo and len(out) < MAX_GLOB_MATCHES and steps < 4 * MAX_GLOB_MATCHES:
        steps += 1
        one = todo.pop()
        group = _brace_group(one)
        if group is None:
            out.append(one)
            continue
        start, end, alts = group
        todo.extend(one[:start] + alt + one[end + 1:] for alt in reversed(alts))
    return out


def _expansions(word: str, bases: Iterable[str], *, hidden: bool = False) -> list[str]:
    """What a shell (or a tool that globs) could make of `word` in each of `bases`: its
    brace alternatives and the files each one's glob matches now (with `hidden`, a `*`
    matches a leading dot too)."""
    out = []
    for alt in _braces(word):
        out.append(alt)
        if any(c in alt for c in "*?["):
            for base in bases:
                pattern = alt if os.path.isabs(alt) else os.path.join(glob.escape(base), alt)
                out.extend(itertools.islice(glob.iglob(pattern, include_hidden=hidden),
                                            MAX_GLOB_MATCHES))
    return out


def _path_words(word: str, bases: Iterable[str], in_shell: bool,
                home: str | None = None) -> list[str]:
    """What `word` could name as a path: itself, the value of `--opt=value`, `-fVALUE` or
    `NAME=value`, what follows its last `@` or `:`, a `file://` URI's path, `~` expanded,
    and in a shell, what its braces and globs expand to."""
    if in_shell and "{" in word:
        return [w for alt in _braces(word)
                for w in _plain_path_words(alt, bases, in_shell, home)] + \
            ([word] if word not in ("", "-") else [])
    return _plain_path_words(word, bases, in_shell, home)


def _plain_path_words(word: str, bases: Iterable[str], in_shell: bool,
                      home: str | None = None) -> list[str]:
    if word in ("", "-"):
        return []
    out = [] if word.startswith("-") else [word]
    if "=" in word:
        out.append(word.split("=", 1)[1])
    elif word.startswith("-") and not word.startswith("--") and len(word) > 2:
        out.append(word[2:])  # a short option's value: `-f.env`
    if "*** " in word:  # Codex's apply_patch names its files inside its one argument
        out.extend(m.group(1).strip() for m in _PATCH_FILE.finditer(word))
    for w in list(out):
        for sep in "@:":  # curl's `-d @.env`, httpie's `f@.env`, git's `HEAD:.env`
            if sep in w:
                out.append(w.rsplit(sep, 1)[1])
    for w in list(out):
        if w.lower().startswith("file:"):
            out.append(unquote(urlsplit(w).path))
        if w.startswith("~"):
            out.extend(_homes(w, home, bases))
    if in_shell and any(c in word for c in "*?["):
        out.extend(_expansions(word, bases)[1:])
    return [w for w in out if w]


# -- decisions -----------------------------------------------------------------------------

@dataclass
class Subject:
    """What a request asks to do, in the terms rules speak."""

    method: str
    # A v2 permission request may say what it is about twice (its prompt's title and its
    # tool call's; a command and the tool call it runs for): rules judge every one.
    kinds: list[object] = field(default_factory=list)
    titles: list[str] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)   # as named, for the log
    places: list[Place] = field(default_factory=list)
    commands: list[Command] = field(default_factory=list)
    cwd: str | None = None

    def describe(self) -> str:
        parts = [self.method]
        if any(self.kinds):
            parts.append("kind=" + ",".join(str(k) for k in self.kinds if k))
        parts.extend(f"title={t!r}" for t in self.titles)
        if self.paths:
            parts.append(f"paths={self.paths}")
        parts.extend(f"command={c.line!r}" for c in self.commands)
        return " ".join(parts)


def rule_matches(rule: Rule, subject: Subject) -> bool:
    """Deny and ask rules match any spelling of what the request names; an allow rule only
    what it certainly reaches (see docs/proxies.md)."""
    strict = rule.action == "allow"
    # allow: every kind, title and command the request names must match; deny, ask: one
    every = all if strict else any
    if rule.kind is not None:
        kinds = [rule.kind] if isinstance(rule.kind, str) else rule.kind
        if not subject.kinds or not every(k in kinds for k in subject.kinds):
            return False
    if rule.title is not None and (not subject.titles or not every(
            fnmatchcase(t, rule.title) for t in subject.titles)):
        return False
    if rule.path is not None:
        if not (_glob_all if strict else _glob_any)(rule.path, subject.places):
            return False
    if rule.command is not None:
        if not subject.commands:
            return False
        if strict:  # every command that will run must be one the rule allows
            return all(not c.opaque and bool(c.simple) and all(
                re.search(rule.command, one) for one in c.simple) for c in subject.commands)
        return any(re.search(rule.command, one) for c in subject.commands
                   for one in c.spellings())
    return True


class Permissions(Proxy[PermissionsOptions]):
    """Allow, deny or ask for tool calls and editor file/terminal access, by declarative rules."""

    options_model = PermissionsOptions
    unreadable = False  # a session/update for no session it could read could not be decoded

    async def chain_started(self) -> None:
        for i, rule in enumerate(self.options.rules):
            if unknown := rule.unknown_kinds():
                self.log.warning(
                    "rule %s names tool kind %s, which ACP does not name (%s): it matches "
                    "only an agent that sends it", rule.name or i + 1,
                    ", ".join(map(repr, unknown)), ", ".join(TOOL_KINDS))

    def decide(self, subject: Subject) -> tuple[Action, str]:
        for i, rule in enumerate(self.options.rules):
            if rule_matches(rule, subject):
                return rule.action, rule.name or f"rule {i + 1}"
        return self.options.default, "default"

    def mcp_servers(self) -> list[Any]:
        """An opt-in `permissions` MCP server: the agent can ask before it tries.
        Declared when the chain file names it ([[mcp_server]] type acp, docs/mcp.md); made
        only then (the `mcp` SDK is a heavy import for a chain that does not use it)."""
        from conductor.plugins import McpOffer

        return [McpOffer(name="permissions", declare=False, build=self._policy_server)]

    def _policy_server(self) -> Any:
        from mcp.server.mcpserver import MCPServer

        from conductor.plugins import tool_context

        server = MCPServer("permissions", instructions=(
            "The editor's policy for this session: ask whether an action would be allowed, "
            "denied or asked about before trying it."))

        @server.tool()
        def check(kind: str = "", path: str = "", title: str = "", command: str = "") -> str:
            """Would the policy allow this action? kind: read, edit, delete, move, search,
            execute, fetch, other; path: a file it touches; title: what it would be called;
            command: a command line. Answers allow, deny or ask, and the rule that decided."""
            session = tool_context().session
            cwd = session.cwd if session is not None else None
            if cwd is None or not os.path.isabs(cwd):
                return "deny (cannot place it: the session has no absolute cwd)"
            # Judged as the permission request the agent would send, by the same rules.
            tool: dict[str, Any] = {"kind": kind or None, "title": title or None}
            if path:
                tool["locations"] = [{"path": os.path.join(cwd, path)}]
            if command:
                tool["rawInput"] = {"command": command}
            try:
                subject = _permission_subject({"toolCall": tool}, cwd, Subject("check"))
            except Unplaceable as e:
                return f"deny (cannot place it: {e})"
            action, by = self.decide(subject)
            return f"{action} (by {by})"

        @server.tool()
        def rules() -> str:
            """The policy's rules, in the order they are checked (first match wins)."""
            lines = [f"{i + 1}. {r.name or f'rule {i + 1}'}: {r.action} "
                     + " ".join(f"{k}={v!r}" for k, v in r.model_dump(
                         exclude={"action", "name"}, exclude_none=True).items())
                     for i, r in enumerate(self.options.rules)]
            return "\n".join([*lines, f"otherwise: {self.options.default}"])

        return server

    def _judge(self, ctx: ProxyContext, method: str, params: dict[str, Any], *,
               refuse: str | None = None) -> tuple[Action, str]:
        """(action, why): a request that cannot be placed (or that `refuse` says is
        unplaceable) is denied before any rule."""
        try:
            if refuse is not None:
                raise Unplaceable(refuse)
            subject = _SUBJECTS[method](params, _session_cwd(ctx), Subject(method))
            action, why = self.decide(subject)
            why = f"by {why}"
        except Unplaceable as e:
            action, why = "deny", f"cannot place it: {e}"
            self.log.info("deny %s %s (%s)", method, _summary(params), why)
            return action, why
        self.log.info("%s %s (%s)", action, subject.describe(), why)
        return action, why

    @watch("session/update", source="successor")
    def update(self, ctx: WatchContext, message: Notification) -> None:
        # A watcher, not a handler: streamed updates keep the router's shortcut past us.
        # Cheap test first: most updates are message chunks, not tool calls. A `\u` escape
        # may spell the key (`"toolCall\u0049d"` is `toolCallId` to the editor): decode then.
        raw = bytes(message.params or b"")
        if b'"toolCallId"' not in raw and b"\\u" not in raw:
            return
        session = ctx.session
        try:
            params = message.params_value()
        except ValueError:  # the editor may read what msgspec refuses
            params = _lenient_value(raw)
        if session is None:  # found by a decoder that reads what the conductor's refuses
            sid = params.get("sessionId") if isinstance(params, dict) else \
                _SESSION_ID.search(raw)
            sid = sid.group(1).decode() if isinstance(sid, re.Match) else sid
            session = ctx.session_for(sid) if isinstance(sid, str) else None
        if params is UNREADABLE:
            # JavaScript's JSON.parse reads deeper than any decoder here: what this update
            # announced is unknown, so no later request naming a tool call is judged
            # without it (in its session, or in every one when it names none readably).
            if session is not None:
                session.state["permissions.unreadable"] = True
            else:
                self.unreadable = True
            self.log.warning("a session/update for %s could not be decoded: permission "
                             "requests naming a tool call are denied from now on",
                             session.session_id if session else "an unknown session")
            return
        if session is not None:
            update = params.get("update") if isinstance(params, dict) else None
            if isinstance(update, dict) and update.get("toolCallId") is not None \
                    and not isinstance(update["toolCallId"], str):
                # An editor may key it as a string ("1" for 1): whichever tool call a later
                # request names, it may be this one, which no string key here finds.
                session.state["permissions.unreadable"] = "an earlier session/update " \
                    "named a tool call by an id that is not a string, which the editor may " \
                    "read as the id of any other"
                self.log.warning("a session/update for %s names tool call %.80r, which is "
                                 "not a string: permission requests naming a tool call are "
                                 "denied from now on", session.session_id,
                                 update["toolCallId"])
                return
            if isinstance(update, dict) and isinstance(update.get("toolCallId"), str):
                calls = session.state.setdefault("permissions.tool_calls", {})
                known = calls.pop(update["toolCallId"], {})
                if update.get("sessionUpdate") == "tool_call_content_chunk":
                    # v2 streams a tool call's content: one more item, replacing none
                    chunk = _diffs_only([update.get("content")])
                    earlier = known.get("content")
                    known["content"] = [*(earlier if isinstance(earlier, list) else []),
                                        *(chunk if isinstance(chunk, list) else [])]
                else:
                    known.update({k: _diffs_only(update[k]) if k == "content" else update[k]
                                  for k in TOOL_CALL_FIELDS if update.get(k) is not None})
                calls[update["toolCallId"]] = known
                if len(calls) > MAX_TOOL_CALLS:
                    oldest = next(iter(calls))
                    _forget(session.state, oldest)
                    del calls[oldest]

    @on("session/request_permission", source="successor")
    async def request_permission(self, ctx: ProxyContext, message: Request) -> JsonValue:
        params = _params(message)
        refuse = None
        if ctx.session is not None:
            calls = ctx.session.state.get("permissions.tool_calls", {})
            params = _with_known(params, calls)
            ids = _tool_call_ids(params)
            forgotten = [i for i in ids if isinstance(i, str)
                         and i not in calls and _forgotten(ctx.session.state, i)]
            if forgotten:
                refuse = f"tool call {forgotten[0]!r:.80} may be one announced before the " \
                    f"last {MAX_TOOL_CALLS} this policy remembers"
            odd = [i for i in ids if not isinstance(i, str)]
            if odd:  # an editor may read 1 as "1", the id of another tool call
                refuse = f"tool call id {odd[0]!r:.80} is not a string (ACP)"
            unreadable = self.unreadable or ctx.session.state.get("permissions.unreadable")
            if unreadable and _names_tool_call(params):
                refuse = unreadable if isinstance(unreadable, str) else "an earlier " \
                    "session/update could not be decoded, so what its tool calls announced " \
                    "is unknown"
        action, _ = self._judge(ctx, message.method, params, refuse=refuse)
        if action == "ask":
            return await ctx.forward()
        # Never `allow_always`: the agent would stop asking for whatever it groups with
        # this call (Claude Code: every later `git ...`), which the policy never sees.
        wanted = ("allow_once",) if action == "allow" else ("reject_once", "reject_always")
        options = params.get("options")
        options = [o for o in options if isinstance(o, dict)] \
            if isinstance(options, list) else []
        # An id that is not a string, or that names options of different kinds, is no
        # answer the agent can surely read as the one chosen (a reject it reads as allow).
        kinds: dict[str, set[object]] = {}
        for option in options:
            if isinstance(option.get("optionId"), str):
                kinds.setdefault(option["optionId"], set()).add(option.get("kind"))
        for kind in wanted:  # prefer the one-off choice: a policy decides each time
            for option in options:
                chosen = option.get("optionId")
                if isinstance(chosen, str) and kinds.get(chosen) == {kind}:
                    return {"outcome": {"outcome": "selected", "optionId": chosen}}
        if action == "allow":  # no clean `allow_once`: only the user may choose to remember
            return await ctx.forward()
        return {"outcome": {"outcome": "cancelled"}}

    @on("fs/read_text_file", source="successor")
    async def read_text_file(self, ctx: ProxyContext, message: Request) -> JsonValue:
        return await self._allow_or_refuse(ctx, message)

    @on("fs/write_text_file", source="successor")
    async def write_text_file(self, ctx: ProxyContext, message: Request) -> JsonValue:
        return await self._allow_or_refuse(ctx, message)

    @on("terminal/create", source="successor")
    async def create_terminal(self, ctx: ProxyContext, message: Request) -> JsonValue:
        return await self._allow_or_refuse(ctx, message)

    async def _allow_or_refuse(self, ctx: ProxyContext, message: Request) -> JsonValue:
        method = message.method
        action, why = self._judge(ctx, method, _params(message))
        # allow and ask both pass the request on: the editor has the file and its own prompts.
        if action == "deny":
            raise RpcError(PERMISSION_DENIED,
                           f"denied by the permissions policy of {self.name} ({why})",
                           {"component": self.name, "method": method, "reason": why})
        return await ctx.forward()


UNREADABLE = object()
_SESSION_ID = re.compile(rb'"sessionId"\s*:\s*"([^"\\]*)"')


def _lenient_value(raw: bytes) -> object:
    """`raw` JSON decoded as an editor might: with lone surrogates, which msgspec refuses
    and JavaScript's JSON.parse reads. UNREADABLE when even that fails (nested too deep)."""
    with suppress(ValueError, RecursionError):
        return json.loads(raw)
    return UNREADABLE


def _bloom_bits(key: str) -> tuple[int, int]:
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return (int.from_bytes(digest[:4], "big") % FORGOTTEN_BITS,
            int.from_bytes(digest[4:], "big") % FORGOTTEN_BITS)


def _forget(state: dict[str, Any], tool_call_id: str) -> None:
    """Mark a tool call the policy no longer remembers: the editor still shows it, so a
    request naming it cannot be judged. In a fixed 8 KiB: an agent announcing without end
    cannot grow it, and a false match only denies."""
    bits = state.setdefault("permissions.forgotten", bytearray(FORGOTTEN_BITS // 8))
    for bit in _bloom_bits(tool_call_id):
        bits[bit >> 3] |= 1 << (bit & 7)


def _forgotten(state: dict[str, Any], tool_call_id: str) -> bool:
    bits = state.get("permissions.forgotten")
    return bits is not None and all(bits[b >> 3] & (1 << (b & 7))
                                    for b in _bloom_bits(tool_call_id))


def _tool_call_ids(params: dict[str, Any]) -> list[object]:
    """The ids of the tool calls a permission request names (v1 and v2), strings or not."""
    about = params.get("subject")
    tools = [params.get("toolCall"), about.get("toolCall") if isinstance(about, dict)
             else None, about if isinstance(about, dict) else None]
    return [t["toolCallId"] for t in tools
            if isinstance(t, dict) and t.get("toolCallId") is not None]


def _names_tool_call(params: dict[str, Any]) -> bool:
    about = params.get("subject")
    return "toolCall" in params or (isinstance(about, dict) and (
        "toolCall" in about or about.get("toolCallId") is not None))


def _with_known(params: dict[str, Any], calls: dict[str, Any]) -> dict[str, Any]:
    """`params` with each tool call it names as the editor will show it: what the tool
    call announced, with what this request says on top (the fields it leaves out keep
    their earlier values). A v2 command subject's `toolCallId` brings its tool call in."""
    def known(tool: dict[str, Any]) -> dict[str, Any]:
        key = tool.get("toolCallId")
        found = calls.get(key, {}) if isinstance(key, str) else {}
        return {**found, **{k: v for k, v in tool.items() if v is not None}}

    if isinstance(params.get("toolCall"), dict):  # v1
        params = {**params, "toolCall": known(params["toolCall"])}
    about = params.get("subject")  # v2
    if isinstance(about, dict):
        if isinstance(about.get("toolCall"), dict):
            params = {**params, "subject": {**about, "toolCall": known(about["toolCall"])}}
        elif about.get("type") == "command" and isinstance(about.get("toolCallId"), str) \
                and about["toolCallId"] in calls:
            # only a tool call announced: an unknown one would add a kind of None, which
            # no allow rule's kind matches (the id alone shows the editor nothing)
            params = {**params, "subject": {**about, "toolCall": known(
                {"toolCallId": about["toolCallId"]})}}
    return params


def _diffs_only(content: object) -> object:
    """Of a tool call's content, what rules judge: the paths of each diff (its texts, which
    may be whole files, are not kept)."""
    if not isinstance(content, list):
        return content
    return [_diff_kept(c) for c in content if isinstance(c, dict) and c.get("type") == "diff"]


def _diff_kept(diff: dict[str, Any]) -> dict[str, Any]:
    kept: dict[str, Any] = {"type": "diff"}
    if "path" in diff or "changes" not in diff:
        kept["path"] = diff.get("path")
    changes = diff.get("changes")
    if "changes" in diff:
        kept["changes"] = [{k: c[k] for k in ("path", "oldPath") if k in c}
                           if isinstance(c, dict) else c for c in changes] \
            if isinstance(changes, list) else changes
    return kept


def _params(message: Request) -> dict[str, Any]:
    return as_object(message.params_value())


def _summary(params: dict[str, Any]) -> str:
    """What a request names, for the log line of one that could not be placed: v1 reads
    `toolCall`; a v2 permission request has its own `title` and a `subject` (a tool call,
    or a command with its cwd)."""
    subject = params.get("subject")
    subject = subject if isinstance(subject, dict) else {}
    tool = params.get("toolCall") or subject.get("toolCall")
    if not isinstance(tool, dict):
        tool = {}
    title = params.get("title") if isinstance(params.get("title"), str) else None  # v2
    shown = {"path": params.get("path"),
             "command": params.get("command") or subject.get("command"),
             "args": params.get("args"), "cwd": params.get("cwd") or subject.get("cwd"),
             "title": title if title is not None else tool.get("title"),
             "sessionId": params.get("sessionId")}
    return " ".join(f"{k}={v!r:.200}" for k, v in shown.items() if v is not None)


def _session_cwd(ctx: ProxyContext) -> str:
    """Raises:
        Unplaceable: the session was never set up through this proxy, or has no usable cwd.
    """
    session = ctx.session
    if session is None:
        raise Unplaceable("the request names no session")
    cwd = session.cwd
    if cwd is None or "\0" in cwd or not os.path.isabs(cwd):
        raise Unplaceable(f"session {session.session_id!r} is unknown to this proxy "
                          "(no session/new, load or resume with an absolute cwd went through it)")
    return cwd


def _file_subject(params: dict[str, Any], cwd: str, subject: Subject, kind: str) -> Subject:
    path = absolute_path(params.get("path"), "path")
    subject.kinds, subject.cwd, subject.paths = [kind], cwd, [path]
    subject.places = [place(path, cwd)]
    return subject


def _terminal_subject(params: dict[str, Any], cwd: str, subject: Subject) -> Subject:
    program, args = params.get("command"), params.get("args") or []
    if not isinstance(program, str) or not program:
        raise Unplaceable(f"command is not a string: {program!r}")
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise Unplaceable("args is not a list of strings")
    where = cwd
    subject.kinds, subject.cwd = ["execute"], cwd
    if params.get("cwd") is not None:
        where = absolute_path(params["cwd"], "cwd")
        subject.paths.append(where)
        subject.places.append(place(where, cwd))
    env = params.get("env") or []
    values = [e.get("value") for e in env if isinstance(e, dict)] if isinstance(env, list) \
        else []
    strings = [v for v in values if isinstance(v, str)]
    if not isinstance(env, list) or len(strings) != len(env):
        raise Unplaceable("env is not a list of {name, value} strings")
    homes = [e["value"] for e in env if e.get("name") == "HOME"]
    home = os.path.join(where, homes[-1]) if homes and homes[-1] else None
    # Some editors hand `command` to a shell: without `args` it is judged as a command
    # line too (which needs no spaces: `cat<.env`, `ls;reboot`).
    script = program if not args else None
    command = command_of([program, *args], where, script=script, home=home)
    subject.commands.append(command)
    for e in env:
        if isinstance(e.get("name"), str):
            _add_variable(command, f"{e['name']}={e['value']}", (where,), 0)
    # Environment values name files too: BASH_ENV=.env makes bash run it, LD_PRELOAD loads
    # it; and some hold lists (LD_PRELOAD splits at spaces and colons, *PATH at colons).
    for value in strings:
        pieces = [p for p in re.split(r"[:\s]+", value) if p] if re.search(r"[:\s]", value) \
            else []
        for word in [value, *pieces]:
            command.add_words(_path_words(word, (where,), in_shell=False, home=home),
                              (where,))
    _add_words(subject, command, cwd)
    return subject


def _permission_subject(params: dict[str, Any], cwd: str, subject: Subject) -> Subject:
    """A permission request in either spelling (the policy does not know which one the
    editor speaks, so a request that uses both is judged by both): v1 `toolCall`; v2
    `title` and `subject`, a `tool_call` (`toolCall`) or a `command` (`command`, `cwd`,
    and the `toolCallId` it runs for, judged with it)."""
    subject.cwd = cwd
    if isinstance(params.get("title"), str):
        subject.titles.append(params["title"])
    for tool in _tool_calls(params):
        _add_tool_call(subject, tool, cwd)
    about = _subject_of(params)
    if about is not None and about.get("type") == "command":
        line = about.get("command")
        if not isinstance(line, str):
            raise Unplaceable(f"subject.command is not a string: {line!r}")
        where = absolute_path(about.get("cwd"), "subject.cwd")
        subject.kinds.append("execute")
        subject.paths.append(where)
        subject.places.append(place(where, cwd))
        command = command_of([line], where, script=line)
        subject.commands.append(command)
        _add_words(subject, command, cwd)
    if not subject.kinds:
        subject.kinds.append(None)
    return subject


def _subject_of(params: dict[str, Any]) -> dict[str, Any] | None:
    """A v2 permission request's `subject` (None when it has none). Raises:
        Unplaceable: a subject this policy does not know (ACP: decline it by policy).
    """
    about = params.get("subject")
    if about is None:
        return None
    kind = about.get("type") if isinstance(about, dict) else None
    if not isinstance(about, dict) or kind not in ("tool_call", "command"):
        raise Unplaceable(f"the permission subject {kind or about!r:.80} is of a type this "
                          "policy does not know")
    return about


def _tool_calls(params: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool calls a permission request names: v1 `toolCall`, v2 `subject.toolCall`.
    Raises:
        Unplaceable: see `_subject_of`.
    """
    about = _subject_of(params)
    tools = [params.get("toolCall"), about.get("toolCall") if about is not None else None]
    return [t for t in tools if isinstance(t, dict)]


def _add_tool_call(subject: Subject, tool: dict[str, Any], cwd: str) -> None:
    subject.kinds.append(tool.get("kind"))
    if isinstance(tool.get("title"), str):
        subject.titles.append(tool["title"])
    for location in tool.get("locations") or []:
        path = absolute_path(location.get("path") if isinstance(location, dict) else None,
                             "toolCall.locations[].path")
        subject.paths.append(path)
        subject.places.append(place(path, cwd))
    content = tool.get("content")
    for item in content if isinstance(content, list) else []:
        if isinstance(item, dict) and item.get("type") == "diff":  # the files it changes
            for value, what in _diff_paths(item):
                path = absolute_path(value, what)
                subject.paths.append(path)
                subject.places.append(place(path, cwd))
    raw = tool.get("rawInput")
    if not isinstance(raw, dict):
        raw = {}
    # Where the tool runs: agents name it differently (Gemini CLI's shell tool `directory`,
    # later `dir_path`; others `cwd`, `workdir`), a relative one from the session's cwd.
    # Each one named is judged, the session's cwd when none is.
    wheres: list[str] = []
    for key, value in raw.items():
        if key.lower() in RAW_INPUT_DIRS and isinstance(value, str) and value:
            if "\0" in value:
                raise Unplaceable(f"toolCall.rawInput.{key} {value!r} has a NUL byte")
            wheres.append(os.path.join(cwd, value))
            if value[:1] == "~":  # the tool may expand it as a shell would
                wheres.extend(h for h in _homes(value, None) if os.path.isabs(h))
    wheres = wheres or [cwd]
    commands: list[Command] = []
    for key in RAW_INPUT_COMMANDS:  # Codex's exec_command: cmd
        line = raw.get(key)
        if isinstance(line, list) and all(isinstance(w, str) for w in line):
            commands.append(command_of(line, tuple(wheres)))
        elif isinstance(line, str):  # agents' shell tools take one command line
            commands.append(command_of([line], tuple(wheres), script=line))
            args = raw.get("args")
            if isinstance(args, list) and all(isinstance(a, str) for a in args):
                # a program and its arguments, as terminal/create takes them
                commands.append(command_of([line, *args], tuple(wheres)))
            elif args is not None:
                raise Unplaceable(f"toolCall.rawInput.args is not a list of strings: "
                                  f"{args!r:.80}")
        elif line is not None:  # the editor may show it (`rm -rf x 1`): no rule saw it
            raise Unplaceable(f"toolCall.rawInput.{key} is not a string or a list of "
                              f"strings: {line!r:.80}")
    # Agents name the files of a tool call in rawInput too (path, file_path, notebook_path;
    # a list under paths, file_paths; a search's filter under glob or include).
    fields = _raw_fields(raw)
    roots = [os.path.join(w, one) for key, value in fields
             if _names_paths(key)
             for one in (value if isinstance(value, list) else [value])
             if isinstance(one, str) and one and "\0" not in one for w in wheres]
    for key, value in fields:
        if key.lower().endswith(("url", "uri", "urls", "uris")):
            for url in value if isinstance(value, list) else [value]:
                if isinstance(url, str) and url.lower().startswith("file:"):
                    # a fetch tool reads a file URL too
                    path = unquote(urlsplit(url).path)
                    subject.paths.append(url)
                    subject.places.append(Placer(cwd).place(path,
                                                            strict=os.path.isabs(path)))
        filters = key.lower() in RAW_INPUT_GLOBS
        if not _names_paths(key) and not filters:
            continue
        # a search tool's filter names files in the directories it searches
        bases = [*wheres, *roots] if filters else wheres
        for one in value if isinstance(value, list) else [value]:
            if isinstance(one, str) and one:
                subject.paths.append(one)
                subject.places.extend(_unexpanded(Placer(cwd).place(
                    one, base=where, strict=os.path.isabs(one) and not filters))
                    for where in bases)
                # a read-many or search tool may expand a glob, braces too, as a shell does
                # (a tool's `*` may match `.env`, as ripgrep's does)
                subject.places.extend(Placer(cwd).place(alt, base=where, strict=False)
                                      for alt in (_expansions(one, bases, hidden=True)
                                                  if any(c in one for c in EXPANDING)
                                                  else []) for where in bases)
                # an agent's tool may expand `~` (`~/.netrc`) as a shell would
                subject.places.extend(Placer(cwd).place(home, strict=False)
                                      for home in (_homes(one, None) if one[:1] == "~"
                                                   else []))
    for command in commands:
        subject.commands.append(command)
        _add_words(subject, command, cwd)


MAX_RAW_FIELDS = 65_536  # fields of one rawInput, nested ones too, judged for paths


def _raw_fields(raw: dict[str, Any]) -> list[tuple[str, Any]]:
    """Every (name, value) of `raw` and of the objects nested in it (a tool's `arguments`,
    a list of `edits`); the keys of a `changes` object (Codex's patch: path -> change) as
    `path` fields. Objects nested more than MAX_DEPTH deep are not looked into (a tool's
    own data, not the files it names). Raises:
        Unplaceable: more than MAX_RAW_FIELDS of them.
    """
    fields: list[tuple[str, Any]] = []
    todo: list[tuple[dict[str, Any], int]] = [(raw, 0)]
    while todo:
        one, depth = todo.pop()
        for key, value in one.items():
            fields.append((key, value))
            if key.lower() == "changes" and isinstance(value, dict):
                fields.append(("path", list(value)))
            for item in value if isinstance(value, list) and depth < MAX_DEPTH else [value]:
                if isinstance(item, dict) and depth < MAX_DEPTH:
                    todo.append((item, depth + 1))
        if len(fields) > MAX_RAW_FIELDS:
            raise Unplaceable(f"toolCall.rawInput has more than {MAX_RAW_FIELDS} fields")
    return fields


def _diff_paths(diff: dict[str, Any]) -> list[tuple[object, str]]:
    """The files a diff changes, each with where it was found: v1's `path`; v2's
    `changes[].path` and, for a move or copy, `changes[].oldPath`.

    Raises:
        Unplaceable: `changes` is not a list of objects.
    """
    changes = diff.get("changes")
    found: list[tuple[object, str]] = []
    if "path" in diff or changes is None:  # v1 requires it: a diff naming no file is refused
        found.append((diff.get("path"), "toolCall.content[].path"))
    if changes is not None:
        if not isinstance(changes, list) or not all(isinstance(c, dict) for c in changes):
            raise Unplaceable(f"toolCall.content[].changes is not a list of changes: "
                              f"{changes!r:.80}")
        for change in changes:
            found.append((change.get("path"), "toolCall.content[].changes[].path"))
            if "oldPath" in change:
                found.append((change["oldPath"], "toolCall.content[].changes[].oldPath"))
    return found


def _add_words(subject: Subject, command: Command, cwd: str) -> None:
    placer = Placer(cwd)
    for word, bases in command.words:
        for base in bases or (cwd,):
            subject.places.append(_unexpanded(placer.place(word, base=base, strict=False)))


def _unexpanded(place: Place) -> Place:
    """`place`, which no allow rule matches when it may expand to other files (a glob, a
    brace, a variable): its expansions are judged as places of their own, but only up to
    MAX_GLOB_MATCHES, and a tool may expand more (`**`) than the policy does."""
    if any(c in place.shown for c in EXPANDING):
        return Place(place.shown, place.names, None)
    return place


_SUBJECTS: dict[str, Any] = {
    "session/request_permission": _permission_subject,
    "fs/read_text_file": lambda p, cwd, s: _file_subject(p, cwd, s, "read"),
    "fs/write_text_file": lambda p, cwd, s: _file_subject(p, cwd, s, "edit"),
    "terminal/create": _terminal_subject,
}
