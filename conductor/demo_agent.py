"""A deterministic ACP agent for demos and tests. Plain stdlib, synchronous, one process.

It streams a short answer word by word, and asks for permission first when the prompt
mentions "permission" (or "write"); a denied permission ends the turn with `refusal`.
"""

from __future__ import annotations

import itertools
import json
import sys
from typing import Any

ANSWER = "Hello from the demo agent. You said: {prompt}"


class DemoAgent:
    def __init__(self, out: Any, inp: Any, protocol_version: int | None = None) -> None:
        self.out, self.inp = out, inp
        self.forced_version = protocol_version
        self.sessions: set[str] = set()
        self.ids = itertools.count(1)
        self.queue: list[dict[str, Any]] = []   # messages read while waiting for an answer
        self.cancelled: set[str] = set()

    def send(self, message: dict[str, Any]) -> None:
        self.out.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
        self.out.flush()

    def read(self) -> dict[str, Any] | None:
        if self.queue:
            return self.queue.pop(0)
        for line in self.inp:
            if line.strip():
                return json.loads(line)
        return None

    def serve(self) -> None:
        while (msg := self.read()) is not None:
            self.dispatch(msg)

    def dispatch(self, msg: dict[str, Any]) -> None:
        method, ident, params = msg.get("method"), msg.get("id"), msg.get("params") or {}
        if method is None:
            return  # a stray response
        handler = getattr(self, "on_" + method.replace("/", "_"), None)
        if handler is None:
            if ident is not None:
                self.send({"id": ident, "error": {"code": -32601, "message": "Method not found",
                                                  "data": {"method": method}}})
            return
        result = handler(params)
        if ident is not None:
            self.send({"id": ident, "result": result})

    def on_initialize(self, params: dict[str, Any]) -> dict[str, Any]:
        asked = params.get("protocolVersion", 1)
        version = self.forced_version or (2 if isinstance(asked, int) and asked >= 2 else 1)
        return {"protocolVersion": version,
                "agentCapabilities": {"loadSession": True,
                                      "promptCapabilities": {"image": False, "audio": False,
                                                             "embeddedContext": True},
                                      "mcpCapabilities": {"http": False, "sse": False}},
                "agentInfo": {"name": "demo-agent", "version": "0.1.0"},
                "authMethods": []}

    def on_session_new(self, params: dict[str, Any]) -> dict[str, Any]:
        sid = f"demo-session-{len(self.sessions) + 1}"
        self.sessions.add(sid)
        return {"sessionId": sid}

    def on_session_load(self, params: dict[str, Any]) -> None:
        sid = params.get("sessionId", "")
        self.sessions.add(sid)
        self.update(sid, {"sessionUpdate": "user_message_chunk",
                          "content": {"type": "text", "text": "(replayed history)"}})
        return None

    def on_session_cancel(self, params: dict[str, Any]) -> None:
        self.cancelled.add(params.get("sessionId", ""))

    def update(self, sid: str, update: dict[str, Any]) -> None:
        self.send({"method": "session/update", "params": {"sessionId": sid, "update": update}})

    def ask(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Send a request to the client and wait for its answer, queueing other messages."""
        ident = f"demo-{next(self.ids)}"
        self.send({"id": ident, "method": method, "params": params})
        while True:
            msg = None
            for line in self.inp:
                if line.strip():
                    msg = json.loads(line)
                    break
            if msg is None:
                return {"error": {"message": "client went away"}}
            if msg.get("id") == ident and "method" not in msg:
                return msg
            if msg.get("method") == "session/cancel":
                self.on_session_cancel(msg.get("params") or {})
            self.queue.append(msg)

    def on_session_prompt(self, params: dict[str, Any]) -> dict[str, Any]:
        sid = params.get("sessionId", "")
        self.cancelled.discard(sid)
        text = " ".join(b.get("text", "") for b in params.get("prompt", [])
                        if isinstance(b, dict) and b.get("type") == "text")
        if any(word in text.lower() for word in ("permission", "write")):
            self.update(sid, {"sessionUpdate": "tool_call", "toolCallId": "call-1",
                              "title": "Write notes.txt", "kind": "edit", "status": "pending"})
            answer = self.ask("session/request_permission", {
                "sessionId": sid,
                "toolCall": {"toolCallId": "call-1", "title": "Write notes.txt", "kind": "edit"},
                "options": [{"optionId": "allow", "name": "Allow", "kind": "allow_once"},
                            {"optionId": "reject", "name": "Reject", "kind": "reject_once"}]})
            outcome = (answer.get("result") or {}).get("outcome") or {}
            if outcome.get("outcome") == "cancelled":
                return {"stopReason": "cancelled"}
            allowed = outcome.get("outcome") == "selected" and outcome.get("optionId") == "allow"
            self.update(sid, {"sessionUpdate": "tool_call_update", "toolCallId": "call-1",
                              "status": "completed" if allowed else "failed"})
            if not allowed:
                return {"stopReason": "refusal"}
        for word in ANSWER.format(prompt=text).split(" "):
            if sid in self.cancelled:
                return {"stopReason": "cancelled"}
            self.update(sid, {"sessionUpdate": "agent_message_chunk",
                              "content": {"type": "text", "text": word + " "}})
        return {"stopReason": "end_turn"}


def serve_stdio(protocol_version: int | None = None) -> None:
    inp = open(sys.stdin.fileno(), encoding="utf-8", closefd=False)  # noqa: SIM115
    DemoAgent(sys.stdout, inp, protocol_version).serve()


if __name__ == "__main__":
    serve_stdio()
