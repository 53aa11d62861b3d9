"""`acp-conductor mcp-shim KEY`: what an agent spawns for an MCP server the bridge serves.

Plain stdlib and two threads: it connects to the conductor's Unix socket
($ACP_CONDUCTOR_MCP_SOCKET), says which server it wants and proves itself with
$ACP_CONDUCTOR_MCP_TOKEN, then copies lines between its stdin/stdout (the agent's MCP
client) and the socket until either side closes. Nothing but MCP messages on stdout.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading

SOCKET_ENV = "ACP_CONDUCTOR_MCP_SOCKET"
TOKEN_ENV = "ACP_CONDUCTOR_MCP_TOKEN"


def run(key: str) -> int:
    path, token = os.environ.get(SOCKET_ENV), os.environ.get(TOKEN_ENV)
    if not path or not token:
        sys.stderr.write(f"mcp-shim: {SOCKET_ENV} and {TOKEN_ENV} must be set (the conductor "
                         "sets them in the MCP server declaration it gives the agent)\n")
        return 2
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError as e:
        sys.stderr.write(f"mcp-shim: cannot reach the conductor at {path}: {e.strerror}\n")
        return 1
    conn.sendall(json.dumps({"server": key, "token": token}).encode() + b"\n")
    from_conductor = conn.makefile("rb")
    answer = json.loads(from_conductor.readline() or b"{}")
    if answer.get("ok") is not True:
        sys.stderr.write(f"mcp-shim: the conductor refused: {answer.get('error', 'closed')}\n")
        return 1
    out = sys.stdout.buffer

    def upstream() -> None:  # the agent's MCP client -> the conductor
        try:
            for line in sys.stdin.buffer:
                conn.sendall(line if line.endswith(b"\n") else line + b"\n")
        except OSError:
            pass
        finally:
            try:
                conn.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    threading.Thread(target=upstream, daemon=True).start()
    try:
        for line in from_conductor:  # the conductor -> the agent, until it closes
            out.write(line)
            out.flush()
    except OSError:  # the agent closed our stdout (it reads no more): nobody to tell
        pass
    # The conductor ended the session, or the agent stopped reading. The agent may still
    # hold our stdin open, with the upstream thread blocked in a read that holds stdin's
    # lock: a normal interpreter exit then aborts on that lock ("Fatal Python error",
    # SIGABRT). Nothing is left to clean up (stdout is flushed, the socket closes with
    # the process), so leave at once.
    os._exit(0)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: acp-conductor mcp-shim KEY\n")
        return 2
    return run(args[0])


if __name__ == "__main__":
    sys.exit(main())
