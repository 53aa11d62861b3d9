"""The conductor's exception tree. Every error says who broke what.

    ConductorError                  base; the CLI exits with `type(e).exit_code`
    ├── ConfigError          (2)    names the file, the field and a fix
    │   └── ChainShapeError         a chain file's shape is wrong: `.partial`, the
    │                               chain its well-formed entries make, to resolve them too
    ├── PluginError          (2)    a plugin could not be found, loaded or validated
    │   ├── PluginNotFoundError     no entry point / module / attribute by that name
    │   └── PluginValidationError   found, but not a Proxy (`.plugin` names it)
    ├── TraceFileError       (2)    a trace file cannot be read, or is not a trace
    ├── ComponentError       (3)    always carries `.component` ("redact", "agent")
    │   ├── ComponentStartError     spawn failed (ENOENT, EACCES)
    │   ├── ComponentExitedError    died mid-session: `.returncode`, last stderr lines
    │   ├── ComponentDisconnectedError  a remote component's connection dropped: `.url`
    │   ├── ComponentRestartingError  exited and is being restarted (`restart = "on-failure"`)
    │   └── ComponentStoppedError   stopped by the conductor's shutdown before it answered
    └── ConnectionClosedError (1)   the peer closed the connection with requests outstanding

    RpcError                        a JSON-RPC error answer (code, message, data)
    └── ProtocolVersionError        initialize named a protocol version we cannot speak

Protocol errors by the client or a component are not exceptions: they are answered on the
wire (-32700, -32600, ...) and serving continues, so no exit code belongs to them.

`RpcError` is not a ConductorError: it is the wire's error value. Raise it from a handler
to answer with exactly that error; `Endpoint.call` raises it for an error answer. Every
other exception a handler raises becomes a wire error in one place
(`conductor.rpc.failure.error_for`), and a ComponentError there gets its own code.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Final, Self

if TYPE_CHECKING:
    from collections.abc import Sequence

    from conductor.config import ChainConfig
    from conductor.jsonrpc.message import JsonValue


class ExplainedCode(enum.IntEnum):
    """An exit code that carries what it means to a user (members: `NAME = value, meaning`)."""

    meaning: str

    def __new__(cls, value: int, meaning: str) -> Self:
        code = int.__new__(cls, value)
        code._value_ = value
        code.meaning = meaning
        return code


class ExitCode(ExplainedCode):
    """The conductor's exit codes: the one definition that `--help`, the README and the
    docs show (`run` adds its own, `RunExit`)."""

    OK = 0, "the client closed the connection and the chain shut down cleanly"
    FAILED = 1, "internal error"
    USAGE = 2, "bad configuration or usage; the message names the file, the field and a fix"
    COMPONENT = 3, "a component failed to start, or exited while the chain was running"
    SIGHUP = 129, "stopped by SIGHUP (its terminal closed), after a graceful shutdown"
    SIGINT = 130, "stopped by SIGINT, after a graceful shutdown"
    SIGTERM = 143, "stopped by SIGTERM, after a graceful shutdown"


class ConductorError(Exception):
    exit_code: int = ExitCode.FAILED


class ConfigError(ConductorError):
    exit_code = ExitCode.USAGE

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None,
                 hint: str | None = None, problems: Sequence[ConductorError] = ()) -> None:
        self.message, self.file, self.field, self.hint = message, file, field, hint
        self.problems = list(problems)  # when this error stands for several
        super().__init__(f"{file}: {self.line()}" if file else self.line())

    def line(self) -> str:
        """The problem without its file: `field: message (hint: ...)`."""
        parts = [f"{self.field}: " if self.field else "", self.message]
        if self.hint:
            parts.append(f" (hint: {self.hint})")
        return "".join(parts)

    @classmethod
    def combine(cls, errors: Sequence[ConductorError], file: str | None) -> ConductorError:
        """One error reporting all of `errors`, one per line (the error itself when alone),
        so a chain file's problems are all fixed in one go."""
        errors = [p for e in errors  # one that stands for several: each of them
                  for p in (e.problems if isinstance(e, ConfigError) and e.problems else [e])]
        if len(errors) == 1:
            return errors[0]
        lines = [e.line() if isinstance(e, ConfigError) else str(e).removeprefix(f"{file}: ")
                 for e in errors]
        return cls(f"{len(errors)} problems:\n  " + "\n  ".join(lines), file=file,
                   problems=errors)


class ChainShapeError(ConfigError):
    """A chain file whose shape is wrong (keys, types, entries that do not fit together).
    `partial` is the chain its well-formed entries make, each malformed one's place held
    (`ChainConfig.malformed`), so that a caller able to resolve plugins
    (`conductor.plan.read_chain`) reports what the well-formed entries would meet at
    start-up in the same error."""

    partial: ChainConfig | None = None


class PluginError(ConductorError):
    exit_code = ExitCode.USAGE

    def located(self, where: str) -> PluginError:
        """The same error, its message prefixed with where the plugin was named."""
        copy = type(self).__new__(type(self))
        copy.__dict__.update(self.__dict__)
        Exception.__init__(copy, f"{where}: {self}")
        return copy


class PluginNotFoundError(PluginError):
    pass


class PluginValidationError(PluginError):
    def __init__(self, plugin: str, message: str) -> None:
        self.plugin = plugin
        super().__init__(f"plugin {plugin!r}: {message}")


class TraceFileError(ConductorError):
    exit_code = ExitCode.USAGE

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        super().__init__(f"{path}: {message}")


class ComponentError(ConductorError):
    exit_code = ExitCode.COMPONENT

    def __init__(self, component: str, message: str) -> None:
        self.component = component
        self.reason = message
        super().__init__(f"{component}: {message}")

    def wire_data(self) -> dict[str, JsonValue]:
        """What `data` of the wire error carries, beyond the message."""
        return {"component": self.component}


class ComponentStartError(ComponentError):
    pass


class ComponentExitedError(ComponentError):
    def __init__(self, component: str, returncode: int | None,
                 stderr_tail: Sequence[str] = (), *, running: bool = False) -> None:
        self.returncode = returncode
        self.stderr_tail = list(stderr_tail)
        status = "is gone" if returncode is None else f"exited with status {returncode}"
        if running:  # its output ended, the process did not: nothing it says can arrive
            status = "closed its stdout without exiting (it is stopped)"
        if returncode is not None and returncode < 0:
            status = f"was killed by signal {-returncode}"
        super().__init__(component, status)

    def __str__(self) -> str:
        text = super().__str__()
        if self.stderr_tail:
            text += f"; last stderr: {self.stderr_tail[-1]}"
        return text

    def wire_data(self) -> dict[str, JsonValue]:
        return {"component": self.component, "returncode": self.returncode,
                "stderrTail": self.stderr_tail}


class ComponentDisconnectedError(ComponentError):
    """A remote component's connection ended while the chain was running: its crash."""

    def __init__(self, component: str, url: str, why: str) -> None:
        self.url = url
        super().__init__(component, f"the connection to {url} dropped ({why})")

    def wire_data(self) -> dict[str, JsonValue]:
        return {"component": self.component, "url": self.url}


class ComponentRestartingError(ComponentError):
    """`component` exited and is being restarted: what a request gets meanwhile."""

    def __init__(self, component: str, why: str) -> None:
        super().__init__(component, f"{why}; it is being restarted, send this again shortly")

    def wire_data(self) -> dict[str, JsonValue]:
        return {"component": self.component, "restarting": True}


class ComponentStoppedError(ComponentError):
    """The conductor stopped `component` (shutdown) while it still owed an answer."""


class ConnectionClosedError(ConductorError):
    """The peer closed the connection while requests were outstanding."""


class RpcError(Exception):
    """A JSON-RPC error answer: raise it from a handler to reply with exactly this error."""

    def __init__(self, code: int, message: str, data: JsonValue = None) -> None:
        self.code, self.message, self.data = int(code), message, data
        super().__init__(message)

    def __str__(self) -> str:
        return f"{self.message} (code {self.code})"

    def to_json(self) -> dict[str, JsonValue]:
        error: dict[str, JsonValue] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


class ProtocolVersionError(RpcError):
    """`initialize` named a protocol version the conductor cannot speak (protocol.md §3)."""


# A log record's `extra`: this failure also reaches the client, as the error answer to its
# request or the error that ends the chain. A client that shows such errors itself (`run`,
# `check`, `call`) keeps these records for --log-level debug: the user reads each failure
# once, in that client's own report.
REACHES_CLIENT: Final = {"reaches_client": True}
