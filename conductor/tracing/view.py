"""Reading a JSONL trace: filters, request/response pairing, and the terminal timeline."""

from __future__ import annotations

import fnmatch
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
from rich.text import Text

from conductor.errors import ConfigError
from conductor.record import Record
from conductor.terminal_text import SHOWN

if TYPE_CHECKING:
    from rich.console import Console

LANE_WIDTH = 14
KIND_STYLE = {"request": "cyan", "response": "green", "notification": "dim",
              "error": "bold red"}


class Trace(Record):
    header: dict[str, Any]
    events: list[dict[str, Any]]
    lanes: list[str]
    cut_off: int | None = None  # the number of an incomplete last line, left out


# What the readers below rely on, by event type: a file from another version or tool that
# lacks one is refused naming the line and field, not shown as an internal KeyError.
_REQUIRED: dict[str, tuple[tuple[str, tuple[type, ...]], ...]] = {
    "message": (("hop", (str,)), ("dir", (str,)), ("kind", (str,)),
                ("flow", (int, type(None)))),
    "lifecycle": (("component", (str,)), ("event", (str,))),
}


def _check_event(event: dict[str, Any], number: int, path: str) -> None:
    fields = (("seq", (int,)), ("time", (int, float)), *_REQUIRED.get(str(event.get("type")), ()))
    for name, types in fields:
        value = event.get(name)
        if not isinstance(value, types) or isinstance(value, bool) or \
                (name == "dir" and value not in ("in", "out")):
            raise ConfigError(f"line {number}: a {event.get('type')!r} event without a valid "
                              f"{name!r} (not a trace this acp-conductor wrote)", file=path,
                              hint="pass a file written by --trace") from None


_MAX_DIGITS = 4000  # below Python's limit for an int's str() (4300)


def _number(spelling: str) -> float | str:
    """A float of the trace; one out of range (`1e400`, copied as a component sent it)
    is kept as its spelling, shown as written rather than as inf or an error."""
    value = float(spelling)
    return value if math.isfinite(value) else spelling


def _integer(spelling: str) -> int | str:
    """An integer of the trace; one too long to show (`1000...0`, 5000 digits) as its
    spelling."""
    return int(spelling) if len(spelling) <= _MAX_DIGITS else spelling


def _decode_event(line: bytes) -> Any:
    try:
        return msgspec.json.decode(line)
    except msgspec.ValidationError:  # a number out of range: the slow path, only for it
        import json

        try:
            return json.loads(line, parse_float=_number, parse_int=_integer)
        except ValueError as e:  # the number came first: the line is broken further on
            raise msgspec.DecodeError(str(e)) from None


def load_trace(path: str | Path) -> Trace:
    """Parse a trace file, pair requests with responses, and order the lanes.

    An incomplete last line (the conductor was killed mid-write, or is still writing it)
    is left out and its number kept in `cut_off`: the events before it still show.

    Raises:
        ConfigError: the file is missing, is not a trace, or is another format version's.
    """
    from conductor.tracing.sink import TRACE_FORMAT_VERSION

    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read trace: {e.strerror}", file=str(path)) from None
    # Only LF ends a trace line: a payload is copied as sent, and a CR between its tokens
    # (JSON whitespace, from a component writing CRLF) is part of the line.
    lines = data.split(b"\n")
    header: dict[str, Any] = {}
    events: list[dict[str, Any]] = []
    cut_off: int | None = None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            event = _decode_event(line)
        except msgspec.DecodeError:
            if number == len(lines) and not data.endswith(b"\n"):
                cut_off = number  # written only in part: show what came before it
                break
            raise ConfigError(f"line {number} is not JSON", file=str(path),
                              hint="pass a file written by --trace") from None
        except RecursionError:  # a message nested too deeply to show: the rest still shows
            continue
        if not isinstance(event, dict):
            continue
        if event.get("type") == "trace":
            header = event
            if not isinstance(header.get("time", 0), (int, float)) or \
                    isinstance(header.get("time"), bool):
                raise ConfigError(f"line {number}: a header without a valid 'time' (not a "
                                  "trace this acp-conductor wrote)", file=str(path),
                                  hint="pass a file written by --trace")
            if header.get("version") != TRACE_FORMAT_VERSION:
                raise ConfigError(
                    f"trace format version {header.get('version')!r}; this acp-conductor "
                    f"reads version {TRACE_FORMAT_VERSION}", file=str(path),
                    hint="read it with the acp-conductor version that wrote it")
        else:
            if not header and not events and "seq" not in event:
                raise ConfigError("not an acp-conductor trace", file=str(path),
                                  hint="pass a file written by --trace")
            _check_event(event, number, str(path))
            events.append(event)
    if not header and not events:
        raise ConfigError("no trace events in it", file=str(path),
                          hint="pass a file written by --trace (the conductor writes its "
                               "first events within 50 ms of starting)")
    pair(events)
    return Trace(header, events, lanes_of(events), cut_off)


def pair(events: list[dict[str, Any]]) -> None:
    """Link each response to its request on the same hop: `pair` (seq) and `ms` on both."""
    open_requests: dict[tuple[Any, ...], dict[str, Any]] = {}
    for event in events:
        if event.get("type") != "message":
            continue
        ident = msgspec.json.encode(event.get("id")).decode()
        if event.get("kind") == "request":
            open_requests[(event["hop"], event["dir"], ident)] = event
        elif event.get("kind") in ("response", "error"):
            other = "out" if event["dir"] == "in" else "in"
            request = open_requests.pop((event["hop"], other, ident), None)
            if request is not None:
                ms = round((event["time"] - request["time"]) * 1000, 3)
                request["pair"], event["pair"] = event["seq"], request["seq"]
                request["ms"] = event["ms"] = ms


class Pending(Record):
    """A request that some component never answered, and where it stopped."""

    flow: Any
    requests: list[dict[str, Any]]  # its request events on every hop, in order
    stopped: dict[str, Any]         # the last of them without an answer: where it stopped
    answer: dict[str, Any] | None   # what its sender got anyway (e.g. shutdown's error)

    @property
    def first(self) -> dict[str, Any]:
        return self.requests[0]

    @property
    def holder(self) -> str:
        """Who has it: the component it was sent to, or the conductor, which received it
        and neither forwarded nor answered it."""
        return str(self.stopped["hop"]) if self.stopped["dir"] == "out" else "conductor"

    @property
    def path(self) -> list[str]:
        """The components it went through, from its sender to where it stopped."""
        path: list[str] = []
        for event in self.requests:
            if event["seq"] > self.stopped["seq"]:
                break
            if not path or path[-1] != event["hop"]:
                path.append(str(event["hop"]))
        if self.holder == "conductor":
            path.append("conductor")
        return path


def pending(events: list[dict[str, Any]]) -> list[Pending]:
    """Every request that was sent on some hop and never answered there (events of a
    `pair`ed trace), one per flow, in the order they started."""
    flows: dict[Any, list[dict[str, Any]]] = {}
    answers: dict[Any, list[dict[str, Any]]] = {}
    for event in events:
        if event.get("type") != "message":
            continue
        key = event.get("flow") if event.get("flow") is not None else ("seq", event["seq"])
        if event.get("kind") == "request":
            flows.setdefault(key, []).append(event)
        elif event.get("kind") in ("response", "error"):
            answers.setdefault(key, []).append(event)
    out = []
    for key, requests in flows.items():
        unanswered = [e for e in requests if "pair" not in e]
        if not unanswered:
            continue
        first = requests[0]
        answer = next((a for a in answers.get(key, ()) if a["hop"] == first["hop"]
                       and a["dir"] != first["dir"]), None)
        out.append(Pending(key, requests, _holder(requests, unanswered), answer))
    return out


def select_pending(trace: Trace, *, session: str | None = None, method: str | None = None,
                   component: str | None = None) -> list[Pending]:
    """The unanswered requests matching every given filter: `session` and `method` (a
    glob) the request's, `component` any component on its way (or an end of its first hop)."""
    out = []
    for item in pending(trace.events):
        first = item.first
        if session is not None and first.get("session") != session:
            continue
        if method is not None and not fnmatch.fnmatchcase(str(first.get("method")), method):
            continue
        if component is not None and component not in item.path and \
                component not in (first.get("from"), first.get("to")):
            continue
        out.append(item)
    return out


def _holder(requests: list[dict[str, Any]],
            unanswered: list[dict[str, Any]]) -> dict[str, Any]:
    """Where it stopped: the last request some component never answered, skipping those
    the conductor answered for (it exited or timed out, so the request that one forwards
    got an answer): the answer went back up, and whoever never passed it on has it. If
    the conductor answered for every one, the last (the component that never did)."""
    live = [e for e in unanswered if not _answered_for(requests, e)]
    return (live or unanswered)[-1]


def _answered_for(requests: list[dict[str, Any]], event: dict[str, Any]) -> bool:
    if event["dir"] != "out":
        return False
    given = [e for e in requests if e["dir"] == "in" and e["seq"] < event["seq"]]
    return bool(given) and "pair" in given[-1]  # what it forwards was answered


def lanes_of(events: list[dict[str, Any]]) -> list[str]:
    """client, conductor, then components in the order they were spawned (then any others)."""
    lanes = ["client", "conductor"]
    for event in events:
        if event.get("type") == "lifecycle" and event.get("event") == "spawned":
            if event["component"] not in lanes:
                lanes.append(event["component"])
    for event in events:
        for name in (event.get("hop"), event.get("component")):
            if isinstance(name, str) and name not in lanes:
                lanes.append(name)
    return lanes


def select(trace: Trace, *, session: str | None = None, method: str | None = None,
           component: str | None = None) -> list[dict[str, Any]]:
    """Events matching every given filter (method is a glob; component matches any end)."""
    out = []
    for event in trace.events:
        if event.get("type") == "message":
            if session is not None and event.get("session") != session:
                continue
            if method is not None and not fnmatch.fnmatchcase(str(event.get("method")), method):
                continue
            if component is not None and component not in (event.get("hop"), event.get("from"),
                                                           event.get("to")):
                continue
        else:
            if session is not None or method is not None:
                continue
            if component is not None and event.get("component") != component:
                continue
        out.append(event)
    return out


def _shown(text: Text) -> Text:
    """What a component wrote (stderr, methods, ids, error messages) is shown, never obeyed
    (conductor/terminal_text.py); one character for one, so styles keep their places."""
    text.plain = text.plain.translate(SHOWN)
    return text


def _arrow(lanes: list[str], src: str, dst: str, style: str) -> Text:
    width = LANE_WIDTH * len(lanes)
    cells = [" "] * width
    centers = {name: i * LANE_WIDTH + LANE_WIDTH // 2 for i, name in enumerate(lanes)}
    for c in centers.values():
        cells[c] = "│"
    a, b = centers.get(src, 0), centers.get(dst, 0)
    lo, hi = min(a, b), max(a, b)
    for i in range(lo, hi + 1):
        cells[i] = "─"
    cells[a] = "●"
    cells[b] = "▶" if b > a else "◀"
    text = Text("".join(cells))
    text.stylize(style, lo, hi + 1)
    return text


def _marker(lanes: list[str], lane: str, style: str) -> Text:
    cells = [" "] * (LANE_WIDTH * len(lanes))
    for i in range(len(lanes)):
        cells[i * LANE_WIDTH + LANE_WIDTH // 2] = "│"
    if lane in lanes:
        cells[lanes.index(lane) * LANE_WIDTH + LANE_WIDTH // 2] = "◆"
    text = Text("".join(cells))
    text.stylize(style)
    return text


def render(trace: Trace, events: list[dict[str, Any]], console: Console) -> None:
    """A timeline: one row per event, one lane per component, arrows between them."""
    start = trace.header.get("time") or (events[0]["time"] if events else 0.0)
    lanes = trace.lanes
    head = Text(" " * 10)
    for name in lanes:
        head.append(name[:LANE_WIDTH - 1].center(LANE_WIDTH), style="bold")
    console.print(_shown(head))
    for event in events:
        offset = Text(f"{(event['time'] - start) * 1000:9.1f} ", style="dim")
        if event.get("type") == "message":
            kind = event.get("kind", "?")
            style = KIND_STYLE.get(kind, "")
            src, dst = (event["hop"], "conductor") if event["dir"] == "in" \
                else ("conductor", event["hop"])
            row = offset + _arrow(lanes, src, dst, style)
            label = Text(f" {event.get('method') or '?'}", style=style)
            ident = event.get("id")
            if ident is not None:
                label.append(f" #{ident}", style="bold")
            label.append(f" {kind}", style="dim")
            if kind == "request" and "pair" not in event:
                label.append(" no answer", style="bold yellow")
            if event.get("ms") is not None and kind != "request":
                label.append(f" {event['ms']:.1f} ms", style="magenta")
            if event.get("session"):
                label.append(f" [{event['session']}]", style="dim")
            label.append(f"  {event.get('from')}→{event.get('to')}", style="dim")
            if kind == "error":
                payload = event.get("payload")  # a string where redaction left it out
                err = payload.get("error") if isinstance(payload, dict) else None
                err = err if isinstance(err, dict) else {}
                label.append(f"  {err.get('code')}: {err.get('message')}", style="bold red")
            console.print(_shown(row + label), overflow="ellipsis", no_wrap=True, crop=False)
        else:
            name, what = event.get("component", "?"), event.get("event", "?")
            style = "red" if what in ("error", "noise", "partial-frame") or (
                what == "exited" and event.get("code") not in (0, None) and
                not event.get("expected")) else "yellow"
            detail = {k: v for k, v in event.items()
                      if k not in ("seq", "time", "type", "component", "event")}
            label = Text(f" {name} {what} " + " ".join(f"{k}={v}" for k, v in detail.items()),
                         style=style if what != "stderr" else "dim")
            console.print(_shown(offset + _marker(lanes, name, style) + label), no_wrap=True,
                          overflow="ellipsis", crop=False)


def _answered_at(trace: Trace, request: dict[str, Any]) -> float:
    """When `request` (a paired one) got its answer."""
    return float(next(e["time"] for e in trace.events if e["seq"] == request["pair"]))


def render_pending(trace: Trace, items: list[Pending], console: Console) -> None:
    """Each unanswered request: where it came from, the way it took, where it stopped."""
    start = trace.header.get("time") or (trace.events[0]["time"] if trace.events else 0.0)
    end = trace.events[-1]["time"] if trace.events else start
    requests = len({e.get("flow") for e in trace.events if e.get("kind") == "request"})
    if not items:
        console.print(f"every request was answered ({requests} requests)")
        return
    console.print(Text(f"{len(items)} of {requests} requests never got an answer "
                       "(the way each took, and who has it):", style="bold"))
    for item in items:
        first, stopped = item.first, item.stopped
        console.print()  # apart from the one before; a "\n" in `head` would show as ␊
        head = Text(f"{first.get('method') or '?'}", style="bold cyan")
        if first.get("client_id") is not None:
            head.append(f" #{first['client_id']}", style="bold")
        if first.get("session"):
            head.append(f" [{first['session']}]", style="dim")
        sender = first["hop"] if first["dir"] == "in" else "the conductor"
        head.append(f"  from {sender} at +{first['time'] - start:.3f}s")
        console.print(_shown(head))
        console.print(_shown(Text("  path: " + " → ".join(item.path))))
        where = Text("  stopped at: ", style="bold")
        where.append(item.holder, style="bold yellow")
        waited = end - stopped["time"]
        if stopped["dir"] == "out":
            where.append(f" (sent #{stopped.get('id')} at +{stopped['time'] - start:.3f}s, "
                         f"no answer in the {waited:.3f}s the trace goes on)")
        else:
            where.append(f" (received from {stopped['hop']} at +{stopped['time'] - start:.3f}s,")
            onward = next((e for e in item.requests if e["seq"] > stopped["seq"]), None)
            if onward is not None and "pair" in onward:  # its sender had gone, most likely
                where.append(f" forwarded to {onward['hop']}, answered at "
                             f"+{_answered_at(trace, onward) - start:.3f}s; that answer never "
                             f"went back to {stopped['hop']})")
            else:
                where.append(f" neither forwarded nor answered in the {waited:.3f}s after)")
        console.print(_shown(where))
        if item.answer is not None:
            err = (item.answer.get("payload") or {}).get("error") \
                if isinstance(item.answer.get("payload"), dict) else None
            if isinstance(err, dict):
                console.print(_shown(Text(f"  {sender} got an error from {item.answer.get('from')}"
                                          f": {err.get('code')}: {err.get('message')}",
                                          style="red")))
            else:
                console.print(_shown(Text(f"  {sender} got an answer from "
                                          f"{item.answer.get('from')}", style="dim")))
