"""The chain's shape: client, proxy:0 ... proxy:n, agent, and who is next to whom.

Every component is a `Hop`: the conductor's endpoint on that connection, plus how that
component spells the proxy protocol. Anything a proxy sends plainly goes to its
predecessor; anything it wraps goes to its successor. In proxy mode the last node is a
virtual `successor`, reached through the client's own connection.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from conductor import acp
from conductor.jsonrpc.message import Message, Notification, Response
from conductor.record import Record
from conductor.routing.roles import Role
from conductor.routing.sessions import CloseReason
from conductor.rpc.endpoint import Endpoint

if TYPE_CHECKING:
    from msgspec import Raw, UnsetType

    from conductor.acp import Dialect
    from conductor.tracing.sink import TraceSink
    from conductor.transport.base import MessageSink




# (method, travelling up from the successor side) -> True when an in-process proxy would
# forward it untouched with nothing earlier still in its dispatch (see Chain._forward).
Passes = Callable[[str, bool], bool]
# (notification, travelling up): an in-process proxy's watchers see a notification the
# router takes past it on its shortcut. Never waits; never raises.
Watch = Callable[[Notification, bool], None]
# (pass_on, *args): an answer routed past an in-process proxy. None when nothing is in its
# dispatch (pass it on now), else what queues `pass_on(*args)` behind what is (awaited:
# True once queued, False if its dispatch has stopped).
Relay = Callable[..., Awaitable[bool] | None]
# (session id, why): an in-process proxy drops its state for a session the router ended
# without a message crossing it (idle expiry, a lost session). Never waits.
Release = Callable[[str, CloseReason], None]


class Hop(Endpoint):
    """The conductor's end of one component's connection. Everything sent on it is traced."""

    def __init__(self, name: str, sink: MessageSink, *, dialect: Dialect | None = None,
                 passes: Passes | None = None, watch: Watch | None = None,
                 relay: Relay | None = None, release: Release | None = None,
                 tracer: TraceSink | None = None, channel: str = "stdout") -> None:
        super().__init__(name, sink)
        self.channel = channel                 # where its messages come from, for the logs
        self.dialect = dialect                 # for proxies: how they spell the envelope
        self.dialect_forced = dialect is not None
        self.passes = passes                   # in-process proxies only
        self.watch = watch                     # in-process proxies with watchers only
        self.relay = relay                     # in-process proxies only
        self.release = release                 # in-process proxies only
        if tracer is not None:
            self.observe = functools.partial(_trace_out, tracer, name)


class Node(Record, eq=False):
    index: int
    name: str
    role: Role
    hop: Hop


class ComponentLink(Record, frozen=True):
    """What the start-up callback hands the router for each started component."""

    name: str
    role: Role
    hop: Hop


class Topology:
    """The nodes in chain order; node 0 is the client."""

    def __init__(self, client: Hop, *, proxy_mode: bool) -> None:
        self.proxy_mode = proxy_mode
        self.client = client
        self.nodes: list[Node] = [Node(0, "client", Role.CLIENT, client)]
        self._node_of: dict[Hop, Node] = {client: self.nodes[0]}
        self._sides: list[Node] = []

    def attach(self, links: list[ComponentLink]) -> None:
        for link in links:
            node = Node(len(self.nodes), link.name, link.role, link.hop)
            self.nodes.append(node)
            if link.role is not Role.SUCCESSOR:
                self._node_of[link.hop] = node
        if self.proxy_mode:
            self.nodes.append(Node(len(self.nodes), "successor", Role.SUCCESSOR, self.client))
        for side in self._sides:  # one past the last: everything else is upstream of it
            side.index = len(self.nodes)

    @property
    def started(self) -> bool:
        return len(self.nodes) > 1

    @property
    def last(self) -> Node:
        """The agent (or, in proxy mode, the virtual successor)."""
        return self.nodes[-1]

    def node_of(self, hop: Hop) -> Node:
        return self._node_of[hop]

    def find(self, hop: Hop) -> Node | None:
        return self._node_of.get(hop)

    def add_side(self, name: str, hop: Hop) -> Node:
        """A connection that is no link of the chain (the MCP bridge's): it can be routed
        to and from, one past the agent, but is never anyone's neighbour."""
        node = Node(len(self.nodes), name, Role.AGENT, hop)
        self._node_of[hop] = node
        self._sides.append(node)
        return node

    def named(self, name: str) -> Node | None:
        return next((n for n in self.nodes if n.name == name and n.role is not Role.CLIENT),
                    None)

    # -- a component restarted or gone (docs/reliability.md) --

    def adopt(self, node: Node, hop: Hop) -> None:
        """Messages from `hop` (a restarted component) are `node`'s from now on; messages to
        `node` still go to its old hop until `swap`."""
        self._node_of[hop] = node

    def disown(self, hop: Hop) -> None:
        """`hop` was adopted but never swapped in (its component did not come back)."""
        node = self._node_of.get(hop)
        if node is not None and node.hop is not hop:
            del self._node_of[hop]

    def swap(self, node: Node, hop: Hop) -> Hop:
        """`node` is reached on `hop` from now on; returns the old hop."""
        old, node.hop = node.hop, hop
        self._node_of[hop] = node
        if old is not hop:
            self._node_of.pop(old, None)
        return old

    def remove(self, node: Node) -> None:
        """`node` (an optional proxy) is gone: the chain closes up around it."""
        self.nodes.remove(node)
        self._node_of.pop(node.hop, None)
        for i, each in enumerate(self.nodes):
            each.index = i
        for side in self._sides:  # still one past the last
            side.index = len(self.nodes)

    def first(self) -> Node:
        return self.nodes[1]

    def after(self, node: Node) -> Node:
        return self.nodes[node.index + 1]

    def before(self, node: Node) -> Node:
        return self.nodes[node.index - 1]

    def hops(self) -> list[Hop]:
        """Every component's hop, in chain order (not the client's)."""
        return [n.hop for n in self.nodes[1:] if n.role is not Role.SUCCESSOR]

    def addressee(self, hop: Hop, msg: Message) -> str:
        """For traces: the component a message arriving on `hop` is addressed to."""
        if isinstance(msg, Response):
            outgoing = hop.pending.get(_int_key(msg))
            forward = outgoing.context if outgoing is not None else None
            origin = getattr(forward, "origin", None)
            return origin.name if origin is not None else "conductor"
        node = self._node_of.get(hop)
        if node is None or not self.started:
            return "conductor"
        wrapped = msg.method in acp.SUCCESSOR_METHODS
        cancelled = _cancel_target(hop, msg.params, wrapped) \
            if wrapped or msg.method == acp.CANCEL_REQUEST else None
        if cancelled is not None:  # a cancel goes wherever the request it names went
            return cancelled
        if node.role is Role.CLIENT:
            return self.nodes[-2].name if self.proxy_mode and wrapped else self.nodes[1].name
        if node.role is Role.PROXY and wrapped:
            return self.after(node).name
        return self.before(node).name


def _trace_out(tracer: TraceSink, hop: str, message: Message | list[Message], source: str,
               origin: tuple[str, Raw] | None) -> None:
    tracer.message(hop, "out", message, peer=source, origin=origin)


def _cancel_target(hop: Hop, params: Raw | UnsetType, wrapped: bool) -> str | None:
    if wrapped:
        try:
            envelope = acp.decode_envelope(params)
        except ValueError:
            return None
        if envelope.method != acp.CANCEL_REQUEST:
            return None
        params = envelope.params
    inbound = hop.cancelled_by(params)
    return inbound.target.name if inbound is not None and inbound.target is not None else None


def _int_key(msg: Response) -> int:
    text = bytes(msg.id)
    return int(text) if text.isdigit() else -1
