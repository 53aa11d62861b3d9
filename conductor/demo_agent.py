"""A deterministic ACP agent for demos and tests. Plain stdlib, synchronous, one process.

It streams a short answer word by word, and asks for permission first when the prompt
mentions "permission" (or "write"); a denied permission ends the turn with `refusal`.
Words in the prompt drive the rest, for demos of `run` and for tests:
  plan          a thought chunk, a plan, and a usage update before the answer
  read:PATH     reads PATH through the client's fs/read_text_file and quotes it
  writefile:PATH writes a line to PATH through fs/write_text_file
  terminal:CMD  runs `sh -c CMD` through terminal/* and quotes its output
A relative PATH is resolved against the session's cwd: ACP paths are absolute.
  hang          streams one word, then waits for session/cancel (answers `cancelled`)
  stop:REASON   ends the turn with stopReason REASON
  tool          calls a tool of an MCP server declared to the session: it speaks
                MCP-over-ACP itself (mcp/connect, mcp/message), so it takes `acp` servers
                only; `tool:NAME` picks the tool, else the first it can fill (string
                arguments get the prompt's text)
Asked for ACP v2, it speaks v2: its initialize answer has `info` and `capabilities`, a
prompt is answered `{}` as soon as it is accepted and the turn ends with a `state_update`
to idle carrying the stop reason, and a permission request has a `title` and a `subject`.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from typing import Any

ANSWER = "Hello from the demo agent. You said: {prompt}"


class DemoAgent:
    def __init__(self, out: Any, inp: Any, protocol_version: int | None = None) -> None:
        self.out, self.inp = out, inp
        self.forced_version = protocol_version
        self.version = 1  # as its initialize answered
        self.sessions: dict[str, str] = {}     # session id -> its cwd
        self.ids = itertools.count(1)
        self.queue: list[dict[str, Any]] = []   # messages read while waiting for an answer
        self.cancelled: set[str] = set()
        self.mcp_servers: dict[str, list[Any]] = {}  # session -> its acp MCP servers

    def send(self, message: dict[str, Any]) -> None:
        self.out.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
        self.out.flush()

    def read(self) -> dict[str, Any] | None:
        if self.queue:
            return self.queue.pop(0)
        return self.read_line()

    def serve(self) -> None:
        while (msg := self.read()) is not None:
            self.dispatch(msg)

    def dispatch(self, msg: dict[str, Any]) -> None:
        method, ident, params = msg.get("method"), msg.get("id"), msg.get("params") or {}
        if method is None:
            return  # a stray response
        if not isinstance(method, str) or not isinstance(params, dict):
            if ident is not None:
                self.send({"id": ident, "error": {
                    "code": -32600 if not isinstance(method, str) else -32602,
                    "message": "Invalid Request" if not isinstance(method, str)
                    else "Invalid params: the demo agent takes params as an object"}})
            return
        handler = getattr(self, "on_" + method.replace("/", "_"), None)
        if handler is None:
            if ident is not None:
                self.send({"id": ident, "error": {"code": -32601, "message": "Method not found",
                                                  "data": {"method": method}}})
            return
        if method == "session/prompt" and self.version >= 2:
            # v2: the answer accepts the prompt; the turn runs on, to its idle state.
            if ident is not None:
                self.send({"id": ident, "result": {}})
            ended = handler(params)
            self.update(params.get("sessionId", ""), {
                "sessionUpdate": "state_update", "state": "idle",
                "stopReason": ended.get("stopReason")})
            return
        result = handler(params)
        if ident is not None:
            self.send({"id": ident, "result": result})

    def on_initialize(self, params: dict[str, Any]) -> dict[str, Any]:
        asked = params.get("protocolVersion", 1)
        version = self.forced_version or (2 if isinstance(asked, int) and asked >= 2 else 1)
        self.version = version
        if version >= 2:
            return {"protocolVersion": version,
                    "info": {"name": "demo-agent", "version": "0.1.0"},
                    "capabilities": {"session": {"prompt": {"embeddedContext": {}},
                                                 "mcp": {"acp": {}}}},
                    "authMethods": []}
        result = {"protocolVersion": version,
                  "agentCapabilities": {"loadSession": True,
                                        "sessionCapabilities": {"close": {}},
                                        "promptCapabilities": {"image": False, "audio": False,
                                                               "embeddedContext": True},
                                        "mcpCapabilities": {"http": False, "sse": False,
                                                            "acp": True}},
                  "agentInfo": {"name": "demo-agent", "version": "0.1.0"},
                  "authMethods": []}
        return result

    def remember_servers(self, sid: str, params: dict[str, Any]) -> None:
        servers = params.get("mcpServers") or []
        self.mcp_servers[sid] = [s for s in servers
                                 if isinstance(s, dict) and s.get("type") == "acp"]

    def on_session_new(self, params: dict[str, Any]) -> dict[str, Any]:
        sid = f"demo-session-{len(self.sessions) + 1}"
        self.sessions[sid] = _cwd(params)
        self.remember_servers(sid, params)
        return {"sessionId": sid}

    def on_session_load(self, params: dict[str, Any]) -> None:
        sid = params.get("sessionId", "")
        self.sessions[sid] = _cwd(params)
        self.remember_servers(sid, params)
        self.update(sid, {"sessionUpdate": "user_message_chunk",
                          "content": {"type": "text", "text": "(replayed history)"}})
        return None

    def on_session_close(self, params: dict[str, Any]) -> dict[str, Any]:
        # Nothing runs between turns here, so there is nothing to stop; ids are not reused.
        self.mcp_servers.pop(params.get("sessionId", ""), None)
        return {}

    def on_session_cancel(self, params: dict[str, Any]) -> None:
        self.cancelled.add(params.get("sessionId", ""))

    def update(self, sid: str, update: dict[str, Any]) -> None:
        self.send({"method": "session/update", "params": {"sessionId": sid, "update": update}})

    def read_line(self) -> dict[str, Any] | None:
        """The next message from stdin itself (not the queue), or None at EOF."""
        for line in self.inp:
            if not line.strip():
                continue
            try:
                message = json.loads(line)
            except ValueError:  # not JSON (nor UTF-8): answered, and the agent reads on
                self.send({"id": None, "error": {"code": -32700, "message": "Parse error"}})
                continue
            if isinstance(message, dict):
                return message
            # ACP sends one message a line; a batch or a bare value is refused, not fatal
            self.send({"id": None, "error": {
                "code": -32600, "message": "Invalid Request",
                "data": "the demo agent takes one JSON-RPC object a line (no batches)"}})
        return None

    def ask(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Send a request to the client and wait for its answer, queueing other messages."""
        ident = f"demo-{next(self.ids)}"
        self.send({"id": ident, "method": method, "params": params})
        while True:
            msg = self.read_line()
            if msg is None:
                return {"error": {"message": "client went away"}}
            if msg.get("id") == ident and "method" not in msg:
                return msg
            if msg.get("method") == "session/cancel":
                self.on_session_cancel(msg.get("params") or {})
            if msg.get("method") == "mcp/message" and "id" in msg:
                # an MCP server's own request (elicitation, sampling): not for a demo
                self.send({"id": msg["id"], "error": {
                    "code": -32601, "message": "the demo agent answers no MCP requests"}})
                continue
            self.queue.append(msg)

    def on_session_prompt(self, params: dict[str, Any]) -> dict[str, Any]:
        sid = params.get("sessionId", "")
        self.cancelled.discard(sid)
        text = " ".join(b.get("text", "") for b in params.get("prompt", [])
                        if isinstance(b, dict) and b.get("type") == "text")
        if any(word in text.lower() for word in ("permission", "write")):
            # the file it would write, so a policy can judge the edit by its path, not
            # by a title the agent chooses
            notes = [{"path": os.path.join(self.sessions.get(sid, "/"), "notes.txt")}]
            self.tool_call(sid, {"toolCallId": "call-1", "title": "Write notes.txt",
                                 "kind": "edit", "status": "pending", "locations": notes})
            tool = {"toolCallId": "call-1", "title": "Write notes.txt", "kind": "edit",
                    "locations": notes}
            about: dict[str, Any] = {"toolCall": tool} if self.version < 2 else {
                "title": "Write notes.txt", "subject": {"type": "tool_call", "toolCall": tool}}
            answer = self.ask("session/request_permission", {
                "sessionId": sid, **about,
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
        words = text.split()
        if "plan" in words:
            self.update(sid, {"sessionUpdate": "agent_thought_chunk",
                              "content": {"type": "text", "text": "Thinking about the plan."}})
        if "plan" in words and self.version < 2:  # (v2's plans and usage are shaped anew)
            self.update(sid, {"sessionUpdate": "plan", "entries": [
                {"content": "Read the prompt", "priority": "high", "status": "completed"},
                {"content": "Answer it", "priority": "medium", "status": "in_progress"}]})
            self.update(sid, {"sessionUpdate": "usage_update", "used": 42, "size": 1000,
                              "cost": {"amount": 0.01, "currency": "USD"}})
        for word in words:
            done = self.client_duty(sid, word)
            if done is not None:
                return done
        if any(w.strip(".,!?").lower() in ("tool", "tools") or w.startswith("tool:")
               for w in words):
            self.use_tool(sid, text, words)
        if "hang" in words:
            self.update(sid, {"sessionUpdate": "agent_message_chunk",
                              "content": {"type": "text", "text": "waiting "}})
            self.wait_for_cancel(sid)
            return {"stopReason": "cancelled"}
        for word in ANSWER.format(prompt=text).split(" "):
            if sid in self.cancelled:
                return {"stopReason": "cancelled"}
            self.update(sid, {"sessionUpdate": "agent_message_chunk",
                              "content": {"type": "text", "text": word + " "}})
        reason = next((w.split(":", 1)[1] for w in words if w.startswith("stop:")), "end_turn")
        return {"stopReason": reason}

    def tool_call(self, sid: str, call: dict[str, Any]) -> None:
        """Announce a tool call: v1 `tool_call`; v2 has none, its first `tool_call_update`
        creates it."""
        kind = "tool_call" if self.version < 2 else "tool_call_update"
        self.update(sid, {"sessionUpdate": kind, **call})

    def say(self, sid: str, text: str) -> None:
        self.update(sid, {"sessionUpdate": "agent_message_chunk",
                          "content": {"type": "text", "text": text}})

    def client_duty(self, sid: str, word: str) -> dict[str, Any] | None:
        """read:/writefile:/terminal: words; returns a result only when the turn must end."""
        op, _, arg = word.partition(":")
        if not arg or op not in ("read", "writefile", "terminal"):
            return None
        cwd = self.sessions.get(sid, "/")
        if op == "read":
            answer = self.ask("fs/read_text_file", {"sessionId": sid,
                                                    "path": os.path.join(cwd, arg)})
            if "error" in answer:
                self.say(sid, f"read failed: {answer['error'].get('message')}\n")
            else:
                self.say(sid, f"Read: {answer['result'].get('content', '')}\n")
        elif op == "writefile":
            answer = self.ask("fs/write_text_file", {"sessionId": sid,
                                                     "path": os.path.join(cwd, arg),
                                                     "content": "written by the demo agent\n"})
            self.say(sid, f"write failed: {answer['error'].get('message')}\n"
                     if "error" in answer else f"Wrote {arg}\n")
        else:
            created = self.ask("terminal/create", {"sessionId": sid, "command": "sh",
                                                   "args": ["-c", arg.replace("_", " ")],
                                                   "cwd": cwd})
            if "error" in created:
                self.say(sid, f"terminal failed: {created['error'].get('message')}\n")
                return None
            tid = created["result"]["terminalId"]
            exited = self.ask("terminal/wait_for_exit", {"sessionId": sid, "terminalId": tid})
            output = self.ask("terminal/output", {"sessionId": sid, "terminalId": tid})
            self.ask("terminal/release", {"sessionId": sid, "terminalId": tid})
            self.say(sid, f"Ran: {output['result']['output']!r} exit "
                     f"{exited['result'].get('exitCode')}\n")
        return None

    def use_tool(self, sid: str, text: str, words: list[str]) -> None:
        """Call one tool of the session's acp MCP servers, over MCP-over-ACP."""
        wanted = next((w.split(":", 1)[1] for w in words if w.startswith("tool:")), None)
        servers = self.mcp_servers.get(sid, [])
        if not servers:
            self.say(sid, "No MCP server was declared to this session, so there is no tool "
                     "to call.\n")
            return
        for server in servers:
            connected = self.ask("mcp/connect", {"serverId": server.get("serverId")})
            if "error" in connected:
                self.say(sid, f"mcp/connect to {server.get('name')} failed: "
                         f"{connected['error'].get('message')}\n")
                continue
            conn = connected["result"]["connectionId"]

            def mcp(method: str, params: dict[str, Any] | None = None,
                    conn: str = conn) -> dict[str, Any]:
                body: dict[str, Any] = {"connectionId": conn, "method": method}
                if params is not None:
                    body["params"] = params
                return self.ask("mcp/message", body)

            mcp("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                               "clientInfo": {"name": "demo-agent", "version": "0.1.0"}})
            self.send({"method": "mcp/message", "params": {
                "connectionId": conn, "method": "notifications/initialized"}})
            listed = (mcp("tools/list").get("result") or {}).get("tools") or []
            tool = next((t for t in listed if t.get("name") == wanted), None) if wanted \
                else next((t for t in listed if self.arguments(t, text) is not None), None)
            if tool is not None:
                self.call_tool(sid, server, tool, text, mcp)
            self.ask("mcp/disconnect", {"connectionId": conn})
            if tool is not None:
                return
        self.say(sid, f"No tool {wanted!r} among the declared MCP servers.\n" if wanted
                 else "No tool I could call without help.\n")

    @staticmethod
    def arguments(tool: dict[str, Any], text: str) -> dict[str, Any] | None:
        """Arguments for `tool`: required strings get `text`; None if it needs others."""
        schema = tool.get("inputSchema") or {}
        props = schema.get("properties") or {}
        args: dict[str, Any] = {}
        for name in schema.get("required") or []:
            if (props.get(name) or {}).get("type") != "string":
                return None
            args[name] = text
        return args

    def call_tool(self, sid: str, server: dict[str, Any], tool: dict[str, Any], text: str,
                  mcp: Any) -> None:
        call_id = f"mcp-{next(self.ids)}"
        title = f"{server.get('name')}: {tool.get('name')}"
        self.tool_call(sid, {"toolCallId": call_id, "title": title, "kind": "other",
                             "status": "in_progress"})
        answer = mcp("tools/call", {"name": tool.get("name"),
                                    "arguments": self.arguments(tool, text) or {}})
        result = answer.get("result") or {}
        said = "".join(c.get("text", "") for c in result.get("content") or []
                       if isinstance(c, dict) and c.get("type") == "text")
        failed = "error" in answer or result.get("isError")
        if "error" in answer:
            said = str(answer["error"].get("message"))
        self.update(sid, {"sessionUpdate": "tool_call_update", "toolCallId": call_id,
                          "status": "failed" if failed else "completed",
                          "content": [{"type": "content",
                                       "content": {"type": "text", "text": said}}]})
        self.say(sid, f"Tool {tool.get('name')} of {server.get('name')} "
                 f"{'failed' if failed else 'says'}:\n{said}\n")

    def wait_for_cancel(self, sid: str) -> None:
        while sid not in self.cancelled:
            msg = self.read_line()
            if msg is None:
                return
            if msg.get("method") == "session/cancel":
                self.on_session_cancel(msg.get("params") or {})
            else:
                self.queue.append(msg)


def _cwd(params: dict[str, Any]) -> str:
    """The session's cwd: ACP requires an absolute one; anything else falls back to /."""
    cwd = params.get("cwd")
    return cwd if isinstance(cwd, str) and os.path.isabs(cwd) else "/"


def serve_stdio(protocol_version: int | None = None) -> None:
    inp = open(sys.stdin.fileno(), encoding="utf-8", errors="replace", closefd=False)
    DemoAgent(sys.stdout, inp, protocol_version).serve()


if __name__ == "__main__":
    serve_stdio()
