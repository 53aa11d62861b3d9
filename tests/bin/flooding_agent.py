"""An ACP agent that floods its output: from its first prompt on it writes session/update
after session/update, and goes on after it answers a cancel (it honours the cancel, late
updates and all), until its output is closed. Stdlib only."""

import json
import select
import sys


def send(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def answer(msg: dict) -> None:
    method, ident = msg.get("method"), msg.get("id")
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": ident, "result": {"protocolVersion": 1}})
    elif method == "session/new":
        send({"jsonrpc": "2.0", "id": ident, "result": {"sessionId": "s1"}})
    elif method == "session/prompt":
        prompts.append(ident)
    elif method == "session/cancel":
        while prompts:
            send({"jsonrpc": "2.0", "id": prompts.pop(), "result": {"stopReason": "cancelled"}})
    elif ident is not None and method is not None:
        send({"jsonrpc": "2.0", "id": ident, "result": {}})


prompts: list = []
chunk = {"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s1", "update": {
    "sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "x" * 200}}}}
flooding = False
try:
    while True:
        if select.select([sys.stdin], [], [], 0 if flooding else None)[0]:
            line = sys.stdin.readline()
            if not line:
                break
            answer(json.loads(line))
            flooding = flooding or bool(prompts)
        if flooding:
            for _ in range(100):
                send(chunk)
except (BrokenPipeError, OSError):
    pass
