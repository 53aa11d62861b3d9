"""The conductor's exception tree. Every error says who broke what.

    ConductorError                  base; the CLI exits with `type(e).exit_code`
    ├── ConfigError          (2)    names the file, the field and a fix
    ├── PluginError          (2)    a plugin could not be found, loaded or validated
    │   ├── PluginNotFoundError     no entry point / module / attribute by that name
    │   └── PluginValidationError   found, but not a Proxy (`.plugin` names it)
    ├── ComponentError       (3)    always carries `.component` ("proxy:redact", "agent")
    │   ├── ComponentStartError     spawn failed (ENOENT, EACCES)
    │   └── ComponentExitedError    died mid-session: `.returncode`, last stderr lines

Protocol errors by the client or a component are not exceptions: they are answered on the
wire (-32700, -32600, ...) and serving continues, so no exit code belongs to them.

RpcError(code, message, data) is not a ConductorError: it is a JSON-RPC error reply, raised
by a plugin handler (or by `ProxyContext.request`) to answer with that error.

Exit code 1 is "the run finished but failed" (used by `run`), 130/143 are signals.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence


class ConductorError(Exception):
    exit_code = 1


class ConfigError(ConductorError):
    exit_code = 2

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None,
                 hint: str | None = None) -> None:
        self.file, self.field, self.hint = file, field, hint
        parts = [f"{file}: " if file else "", f"{field}: " if field else "", message]
        if hint:
            parts.append(f" (hint: {hint})")
        super().__init__("".join(parts))


class PluginError(ConductorError):
    exit_code = 2


class PluginNotFoundError(PluginError):
    pass


class PluginValidationError(PluginError):
    def __init__(self, plugin: str, message: str) -> None:
        self.plugin = plugin
        super().__init__(f"plugin {plugin!r}: {message}")


class RpcError(Exception):
    """A JSON-RPC error answer: raise it from a handler to reply with exactly this error."""

    def __init__(self, code: int, message: str, data: object = None) -> None:
        self.code, self.message, self.data = int(code), message, data
        super().__init__(f"{message} ({code})")


class ComponentError(ConductorError):
    exit_code = 3

    def __init__(self, component: str, message: str) -> None:
        self.component = component
        super().__init__(f"{component}: {message}")


class ComponentStartError(ComponentError):
    pass


class ComponentExitedError(ComponentError):
    def __init__(self, component: str, returncode: int | None,
                 stderr_tail: Sequence[str] = ()) -> None:
        self.returncode = returncode
        self.stderr_tail = list(stderr_tail)
        status = "is gone" if returncode is None else f"exited with status {returncode}"
        if returncode is not None and returncode < 0:
            status = f"was killed by signal {-returncode}"
        super().__init__(component, status)

