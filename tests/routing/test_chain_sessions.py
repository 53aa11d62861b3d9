"""The router's session table, driven in memory: who opened which session, and its state."""

from __future__ import annotations

import json
from typing import Any

import anyio

from conductor.errors import ComponentExitedError
from conductor.jsonrpc.message import Message, decode, encode
from conductor.routing.chain import Chain
from conductor.routing.roles import Role
from conductor.routing.sessions import SessionState
from conductor.routing.topology import ComponentLink, Hop


class Outbox:
    """A MessageSink that keeps what the router sent, decoded for assertions."""

    def __init__(self) -> None:
        self.sent: list[dict[str, object]] = []

    async def send(self, item: Message | list[Message]) -> None:
        for msg in item if isinstance(item, list) else [item]:
            self.sent.append(json.loads(encode(msg)))

    async def aclose(self) -> None:
        pass

    def take(self) -> dict[str, object]:
        return self.sent.pop(0)


class Harness:
    def __init__(self) -> None:
        self.out = {name: Outbox() for name in ("client", "proxy", "agent")}
        self.wires = {name: Hop(name, box) for name, box in self.out.items()}

        async def starter() -> list[ComponentLink]:
            return [ComponentLink("proxy", Role.PROXY, self.wires["proxy"]),
                    ComponentLink("agent", Role.AGENT, self.wires["agent"])]

        self.chain = Chain(self.wires["client"], starter)

    async def frame(self, name: str, message: dict[str, object]) -> None:
        with anyio.fail_after(5):
            await self.chain.receive(self.wires[name], decode(json.dumps(message).encode()))

    async def through(self, method: str, params: dict[str, object], result: dict[str, object],
                      ident: object) -> dict[str, object]:
        """The client asks; the proxy forwards in an envelope; the agent answers."""
        await self.frame("client", {"jsonrpc": "2.0", "id": ident, "method": method,
                                    "params": params})
        at_proxy = self.out["proxy"].take()
        await self.frame("proxy", {"jsonrpc": "2.0", "id": f"p-{ident}",
                                   "method": "_proxy/successor",
                                   "params": {"method": method, "params": params}})
        at_agent = self.out["agent"].take()
        assert at_agent["method"] == method
        await self.frame("agent", {"jsonrpc": "2.0", "id": at_agent["id"], "result": result})
        assert self.out["proxy"].take() == {"jsonrpc": "2.0", "id": f"p-{ident}",
                                            "result": result}
        await self.frame("proxy", {"jsonrpc": "2.0", "id": at_proxy["id"], "result": result})
        return self.out["client"].take()


async def test_a_session_opened_by_the_editor_is_recorded_as_the_clients() -> None:
    h = Harness()
    await h.through("initialize", {"protocolVersion": 1}, {"protocolVersion": 1}, 0)
    answer = await h.through("session/new", {"cwd": "/"}, {"sessionId": "S1"}, 1)
    assert answer["result"] == {"sessionId": "S1"}
    record = h.chain.sessions.get("S1")
    assert record is not None
    assert (record.opened_by, record.served_by, record.how) == ("client", "agent", "session/new")
    assert record.state is SessionState.IDLE


async def test_a_session_a_proxy_opens_downstream_is_recorded_as_the_proxys() -> None:
    h = Harness()
    await h.through("initialize", {"protocolVersion": 1}, {"protocolVersion": 1}, 0)
    await h.frame("proxy", {"jsonrpc": "2.0", "id": "own", "method": "_proxy/successor",
                            "params": {"method": "session/new", "params": {"cwd": "/"}}})
    at_agent = h.out["agent"].take()
    await h.frame("agent", {"jsonrpc": "2.0", "id": at_agent["id"],
                            "result": {"sessionId": "P1"}})
    assert h.out["proxy"].take()["result"] == {"sessionId": "P1"}
    record = h.chain.sessions.get("P1")
    assert record is not None
    assert record.opened_by == "proxy"
    assert "P1" in h.chain.sessions
    assert "S1" not in h.chain.sessions


async def test_prompting_and_closing_move_the_session_through_its_states() -> None:
    h = Harness()
    await h.through("initialize", {"protocolVersion": 1}, {"protocolVersion": 1}, 0)
    await h.through("session/new", {"cwd": "/"}, {"sessionId": "S1"}, 1)
    await h.frame("client", {"jsonrpc": "2.0", "id": 2, "method": "session/prompt",
                             "params": {"sessionId": "S1", "prompt": []}})
    at_proxy = h.out["proxy"].take()
    await h.frame("proxy", {"jsonrpc": "2.0", "id": "p2", "method": "_proxy/successor",
                            "params": {"method": "session/prompt",
                                       "params": {"sessionId": "S1", "prompt": []}}})
    at_agent = h.out["agent"].take()
    record = h.chain.sessions.get("S1")
    assert record is not None
    assert record.state is SessionState.PROMPTING
    assert record.prompts == 1
    await h.frame("agent", {"jsonrpc": "2.0", "id": at_agent["id"],
                            "result": {"stopReason": "end_turn"}})
    assert record.state is SessionState.IDLE
    h.out["proxy"].take()
    await h.frame("proxy", {"jsonrpc": "2.0", "id": at_proxy["id"],
                            "result": {"stopReason": "end_turn"}})
    assert h.out["client"].take()["result"] == {"stopReason": "end_turn"}
    await h.through("session/close", {"sessionId": "S1"}, {}, 3)
    assert "S1" not in h.chain.sessions  # a closed session's record is released


async def test_session_load_is_recorded_before_its_answer_so_replayed_updates_route() -> None:
    h = Harness()
    await h.through("initialize", {"protocolVersion": 1}, {"protocolVersion": 1}, 0)
    await h.frame("client", {"jsonrpc": "2.0", "id": 5, "method": "session/load",
                             "params": {"sessionId": "OLD", "cwd": "/"}})
    assert "OLD" in h.chain.sessions  # before anything answered


async def test_a_prompt_or_load_sent_as_a_notification_leaves_the_session_table_as_it_was(
        ) -> None:
    # A notification gets no answer, so nothing would ever end the turn or confirm the load:
    # counted, the session would stay "prompting" for ever (never expired) and a load that
    # nobody confirmed would be recorded (and reopened on a restarted agent).
    h = Harness()
    await h.through("initialize", {"protocolVersion": 1}, {"protocolVersion": 1}, 0)
    await h.through("session/new", {"cwd": "/"}, {"sessionId": "S1"}, 1)
    for method, params in (("session/prompt", {"sessionId": "S1", "prompt": []}),
                           ("session/load", {"sessionId": "S2", "cwd": "/"})):
        await h.frame("client", {"jsonrpc": "2.0", "method": method, "params": params})
        await h.frame("proxy", {"jsonrpc": "2.0", "method": "_proxy/successor",
                                "params": {"method": method, "params": params}})
        assert h.out["agent"].take() == {"jsonrpc": "2.0", "method": method,
                                         "params": params}  # still forwarded, as it came
    record = h.chain.sessions.get("S1")
    assert record is not None
    assert (record.state, record.prompts) == (SessionState.IDLE, 0)
    assert "S2" not in h.chain.sessions


async def test_a_prompt_or_load_refused_because_the_agent_is_gone_leaves_no_record_behind(
        ) -> None:
    # The router answers these itself (the agent failed or is restarting): no answer from
    # the agent will ever run the hooks that end the turn or drop the refused load.
    h = Harness()
    await h.through("initialize", {"protocolVersion": 1}, {"protocolVersion": 1}, 0)
    await h.through("session/new", {"cwd": "/"}, {"sessionId": "S1"}, 1)
    h.wires["agent"].failure = ComponentExitedError("agent", 1)
    for ident, method, params in ((7, "session/prompt", {"sessionId": "S1", "prompt": []}),
                                  (8, "session/load", {"sessionId": "S2", "cwd": "/"})):
        await h.frame("proxy", {"jsonrpc": "2.0", "id": ident, "method": "_proxy/successor",
                                "params": {"method": method, "params": params}})
        refusal = h.out["proxy"].take()
        assert refusal["id"] == ident and "error" in refusal
    record = h.chain.sessions.get("S1")
    assert record is not None
    assert record.state is SessionState.IDLE
    assert "S2" not in h.chain.sessions


async def two_loads_of_one_session() -> tuple[Harness, dict[str, Any], dict[str, Any]]:
    """A proxy sends session/load of "S" twice before either is answered: the harness and
    the two loads as the agent got them."""
    h = Harness()
    await h.through("initialize", {"protocolVersion": 1}, {"protocolVersion": 1}, 0)
    load = {"sessionId": "S", "cwd": "/"}
    for ident in (1, 2):
        await h.frame("proxy", {"jsonrpc": "2.0", "id": f"p{ident}",
                                "method": "_proxy/successor",
                                "params": {"method": "session/load", "params": load}})
    return h, h.out["agent"].take(), h.out["agent"].take()


async def test_a_session_two_loads_race_for_stays_open_when_only_the_first_is_refused() -> None:
    # An editor that retries a load (or two windows loading one session) may see the first
    # refused ("busy") and the second succeed: the session is open at the agent, so its
    # record (and the MCP-over-ACP connections that end with it) must stay.
    h, first, second = await two_loads_of_one_session()
    await h.frame("agent", {"jsonrpc": "2.0", "id": first["id"],
                            "error": {"code": -32000, "message": "busy loading"}})
    await h.frame("agent", {"jsonrpc": "2.0", "id": second["id"], "result": {}})
    assert "S" in h.chain.sessions


async def test_a_session_whose_every_load_is_refused_is_forgotten() -> None:
    h, first, second = await two_loads_of_one_session()
    for asked in (second, first):
        assert "S" in h.chain.sessions  # one is still on its way: its replay must route
        await h.frame("agent", {"jsonrpc": "2.0", "id": asked["id"],
                                "error": {"code": -32000, "message": "no such session"}})
    assert "S" not in h.chain.sessions


async def test_a_session_stays_prompting_while_any_of_its_turns_runs() -> None:
    # A second prompt while one runs (an editor's double send) is usually refused at once:
    # that answer must not mark the session idle under the running turn, or idle expiry
    # could end the session (its proxies' state, its MCP connections) mid-turn.
    h = Harness()
    await h.through("initialize", {"protocolVersion": 1}, {"protocolVersion": 1}, 0)
    await h.through("session/new", {"cwd": "/"}, {"sessionId": "S1"}, 1)
    prompt = {"sessionId": "S1", "prompt": []}
    for ident in ("p1", "p2"):
        await h.frame("proxy", {"jsonrpc": "2.0", "id": ident, "method": "_proxy/successor",
                                "params": {"method": "session/prompt", "params": prompt}})
    first, second = h.out["agent"].take(), h.out["agent"].take()
    await h.frame("agent", {"jsonrpc": "2.0", "id": second["id"],
                            "error": {"code": -32000, "message": "a turn is running"}})
    record = h.chain.sessions.get("S1")
    assert record is not None
    assert record.state is SessionState.PROMPTING
    assert h.chain.sessions.idle_longer_than(0) == []
    await h.frame("agent", {"jsonrpc": "2.0", "id": first["id"],
                            "result": {"stopReason": "end_turn"}})
    assert record.state is SessionState.IDLE


async def test_a_turn_answered_after_its_session_was_closed_and_reloaded_ends_only_itself(
        ) -> None:
    # The old turn's late answer belongs to the closed session, not to the reloaded one
    # whose own turn is running.
    h = Harness()
    await h.through("initialize", {"protocolVersion": 1}, {"protocolVersion": 1}, 0)
    await h.through("session/new", {"cwd": "/"}, {"sessionId": "S1"}, 1)

    async def from_proxy(ident: str, method: str, params: dict[str, object]) -> object:
        await h.frame("proxy", {"jsonrpc": "2.0", "id": ident, "method": "_proxy/successor",
                                "params": {"method": method, "params": params}})
        return h.out["agent"].take()["id"]

    async def agent_answers(ident: object) -> None:
        await h.frame("agent", {"jsonrpc": "2.0", "id": ident, "result": {}})

    old_turn = await from_proxy("a", "session/prompt", {"sessionId": "S1", "prompt": []})
    await agent_answers(await from_proxy("b", "session/close", {"sessionId": "S1"}))
    await agent_answers(await from_proxy("c", "session/load", {"sessionId": "S1", "cwd": "/"}))
    await from_proxy("d", "session/prompt", {"sessionId": "S1", "prompt": []})
    await agent_answers(old_turn)
    record = h.chain.sessions.get("S1")
    assert record is not None
    assert (record.state, record.prompts) == (SessionState.PROMPTING, 1)


async def test_a_session_loaded_again_after_its_close_was_answered_stays_open() -> None:
    # A close and a load of one session race: the agent answers the close, then the load
    # with success. The session is open at the agent, so the router must still know it
    # (a restart reopens it; its traces and MCP-over-ACP connections follow it).
    h = Harness()
    await h.through("initialize", {"protocolVersion": 1}, {"protocolVersion": 1}, 0)
    for ident, method, params in (("p1", "session/load", {"sessionId": "S", "cwd": "/"}),
                                  ("p2", "session/close", {"sessionId": "S"})):
        await h.frame("proxy", {"jsonrpc": "2.0", "id": ident, "method": "_proxy/successor",
                                "params": {"method": method, "params": params}})
    load, close = h.out["agent"].take(), h.out["agent"].take()
    await h.frame("agent", {"jsonrpc": "2.0", "id": close["id"], "result": {}})
    assert "S" not in h.chain.sessions
    await h.frame("agent", {"jsonrpc": "2.0", "id": load["id"], "result": {}})
    record = h.chain.sessions.get("S")
    assert record is not None
    assert record.how == "session/load"
