"""`trace html`: one self-contained page (no network).

Swim lanes, arrows, request/answer pairing, JSON on click; requests never answered are
listed and marked where they stopped, and a long silence between events shows as a gap.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

import msgspec

from conductor.tracing.view import pending

if TYPE_CHECKING:
    from conductor.tracing.view import Pending, Trace

# The page's lines are HTML, CSS and JS kept byte-for-byte, so E501 is waived for the literal.
_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'">
<meta name="viewport" content="width=device-width">
<title>__TITLE__</title>
<style>
body{font:13px/1.4 system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
header{padding:8px 12px;background:#223;color:#eee;display:flex;flex-wrap:wrap;gap:6px 16px;align-items:center}
header h1{font-size:15px;margin:0 12px 0 0}
header label{display:flex;gap:6px;align-items:center}
#pending{background:#fff4d6;border-bottom:1px solid #e0c060;padding:4px 12px;max-height:7.5em;overflow:auto}
#pending:empty{display:none}
#pending div{cursor:pointer;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
#pending div:hover{text-decoration:underline}
#wrap{display:flex;height:calc(100vh - var(--top, 44px))}
#chart{flex:1;min-width:0;overflow-x:auto;overflow-y:scroll}
#heads{position:sticky;top:0;z-index:1;background:#fafafa;display:block}
#detail{width:clamp(260px,30%,460px);flex:none;overflow:auto;border-left:1px solid #ccc;background:#fff;margin:0;font:12px/1.35 ui-monospace,monospace;white-space:pre-wrap;position:relative}
#detail[hidden]{display:none}
#detail pre{margin:0;padding:8px}
#close{position:sticky;top:0;float:right;margin:4px;cursor:pointer}
svg text{font:12px system-ui,sans-serif}
.lane{stroke:#bbb;stroke-dasharray:4 3}
.lanehead{font-weight:bold;text-anchor:middle}
.msg{cursor:pointer}
.msg text,.life text{paint-order:stroke;stroke:#fafafa;stroke-width:3px;stroke-linejoin:round}
.msg:hover .bg{fill:#eef3ff}
.bg{fill:transparent}
.request line{stroke:#1f6fd1}.request text.l{fill:#1f5fb0}
.response line{stroke:#2a9d4b}.response text.l{fill:#1d7a39}
.notification line{stroke:#888}.notification text.l{fill:#666}
.error line{stroke:#d22;stroke-width:2}.error text.l{fill:#c00;font-weight:bold}
.pending line{stroke:#d98c00;stroke-dasharray:6 3}.pending text.l{fill:#a06000}
.stuck .bg{fill:#fff0c8}.stuck .mark{fill:#d98c00}.stuck text.w{fill:#a06000;font-weight:bold}
.life circle{fill:#e0a000}.life.bad circle{fill:#d22}.life text{fill:#8a6d00}
.selected .bg{fill:#ffe9a8}.paired .bg{fill:#fff3cf}
.gap line{stroke:#a0a;stroke-dasharray:2 4}.gap text{fill:#a0a;font-style:italic}
.t{fill:#999;font-size:11px}
.dur{fill:#a0a}
</style></head>
<body data-ready="0" data-errors="0">
<header><h1>__TITLE__</h1>
<label>session <select id="session"><option value="">all</option></select></label>
<label>method <input id="method" placeholder="glob, e.g. session/*" size="18"></label>
<label><input type="checkbox" id="life" checked> lifecycle</label>
<label><input type="checkbox" id="only"> unanswered only</label>
<span id="count"></span></header>
<div id="pending"></div>
<div id="wrap"><div id="chart"></div><div id="detail" hidden><button id="close" title="close">&times;</button><pre id="json"></pre></div></div>
<script type="application/json" id="trace-data">__DATA__</script>
<script>
"use strict";
window.addEventListener("error", function () {
  document.body.dataset.errors = String(Number(document.body.dataset.errors) + 1);
});
const DATA = JSON.parse(document.getElementById("trace-data").textContent);
const SVGNS = "http://www.w3.org/2000/svg";
// Lanes share the chart's width: wide enough to read, narrow enough that a long chain fits
// (below MIN_W the chart scrolls sideways, the lane names staying on top).
const MIN_W = 60, MAX_W = 180, LEFT = 58, ROW_H = 22, GAP_H = 20, HEAD_H = 40, GAP_S = 1.0;
const bySeq = new Map(DATA.events.map(function (e) { return [e.seq, e]; }));
const t0 = DATA.header.time || (DATA.events.length ? DATA.events[0].time : 0);
const waiting = new Map();  // seq of an unanswered request -> its pending entry
const stuckAt = new Map();  // seq of the request where one stopped -> its pending entry
for (const p of DATA.pending) {
  for (const seq of p.unanswered) waiting.set(seq, p);
  stuckAt.set(p.stopped, p);
}
let laneW = MAX_W;
function el(name, attrs, parent) {
  const node = document.createElementNS(SVGNS, name);
  for (const k in attrs) node.setAttribute(k, attrs[k]);
  if (parent) parent.appendChild(node);
  return node;
}
function globToRegExp(glob) {
  const esc = glob.replace(/[.+^${}()|[\\]\\\\]/g, "\\\\$&").replace(/\\*/g, ".*").replace(/\\?/g, ".");
  return new RegExp("^" + esc + "$");
}
function laneX(name) {
  const i = DATA.lanes.indexOf(name);
  return LEFT + (i < 0 ? 0 : i) * laneW + laneW / 2;
}
function fit(text, width) {
  const chars = Math.max(3, Math.floor(width / 7));
  return text.length <= chars ? text : text.slice(0, chars - 1) + "\\u2026";
}
function seconds(s) { return s >= 10 ? s.toFixed(0) + " s" : s.toFixed(1) + " s"; }
const sessions = Array.from(new Set(DATA.events.map(function (e) { return e.session; })
  .filter(function (s) { return s; })));
for (const s of sessions) {
  const o = document.createElement("option"); o.value = s; o.textContent = s;
  document.getElementById("session").appendChild(o);
}
let selected = null;
function visible() {
  const session = document.getElementById("session").value;
  const method = document.getElementById("method").value.trim();
  const life = document.getElementById("life").checked;
  const only = document.getElementById("only").checked;
  const re = method ? globToRegExp(method) : null;
  return DATA.events.filter(function (e) {
    if (e.type !== "message") return life && !session && !re && !only;
    if (only && !waiting.has(e.seq)) return false;
    if (session && e.session !== session) return false;
    if (re && !re.test(String(e.method))) return false;
    return true;
  });
}
function show(e) {
  selected = e.seq;
  const detail = document.getElementById("detail");
  const reflow = detail.hidden;
  detail.hidden = false;
  document.getElementById("json").textContent = JSON.stringify(e, null, 2);
  if (reflow) { render(); return; }
  for (const g of document.querySelectorAll(".msg, .life")) {
    const seq = Number(g.dataset.seq);
    g.classList.toggle("selected", seq === e.seq);
    g.classList.toggle("paired", e.pair !== undefined && seq === e.pair);
  }
}
function describe(p) {
  return "\\u25a0 " + p.method + (p.client_id !== null ? " #" + JSON.stringify(p.client_id) : "") +
    (p.session ? " [" + p.session + "]" : "") + " \\u2014 stopped at " + p.holder +
    ", never answered (" + p.path.join(" \\u2192 ") + ")";
}
const list = document.getElementById("pending");
for (const p of DATA.pending) {
  const row = document.createElement("div");
  row.className = "pend"; row.dataset.seq = p.stopped; row.textContent = describe(p);
  row.addEventListener("click", function () {
    show(bySeq.get(p.stopped));
    const g = document.querySelector('[data-seq="' + p.stopped + '"]');
    if (g) g.scrollIntoView({block: "center"});
  });
  list.appendChild(row);
}
function heads(chart, width) {
  const svg = el("svg", {width: width, height: HEAD_H, id: "heads"}, chart);
  const stagger = laneW < 120;
  DATA.lanes.forEach(function (name, i) {
    const x = laneX(name);
    const label = el("text", {x: x, y: stagger && i % 2 ? 34 : 16, "class": "lanehead",
                              "data-head": name}, svg);
    label.textContent = fit(name, (stagger ? 2 : 1) * laneW - 6);
    el("title", {}, label).textContent = name;
  });
}
function render() {
  const events = visible();
  const chart = document.getElementById("chart");
  chart.textContent = "";
  const room = chart.clientWidth - LEFT - 12;
  laneW = Math.max(MIN_W, Math.min(MAX_W, Math.floor(room / Math.max(1, DATA.lanes.length))));
  const width = LEFT + DATA.lanes.length * laneW + 12;
  let gaps = 0;
  for (let i = 1; i < events.length; i++) if (events[i].time - events[i - 1].time > GAP_S) gaps++;
  const height = events.length * ROW_H + gaps * GAP_H + 20;
  heads(chart, width);
  const svg = el("svg", {width: width, height: height, id: "timeline"}, chart);
  const defs = el("defs", {}, svg);
  for (const [k, c] of [["request", "#1f6fd1"], ["response", "#2a9d4b"],
                        ["notification", "#888"], ["error", "#d22"], ["pending", "#d98c00"]]) {
    const m = el("marker", {id: "head-" + k, viewBox: "0 0 10 10", refX: 10, refY: 5,
                            markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse"}, defs);
    el("path", {d: "M0,0 L10,5 L0,10 z", fill: c}, m);
  }
  DATA.lanes.forEach(function (name) {
    const x = laneX(name);
    const g = el("g", {"class": "lanegroup", "data-lane": name}, svg);
    el("line", {x1: x, y1: 0, x2: x, y2: height, "class": "lane"}, g);
  });
  let y = 4;
  events.forEach(function (e, i) {
    const gap = i > 0 ? e.time - events[i - 1].time : 0;
    if (gap > GAP_S) {
      const g = el("g", {"class": "gap", "data-gap": gap.toFixed(3)}, svg);
      el("line", {x1: 0, y1: y + GAP_H / 2, x2: width, y2: y + GAP_H / 2}, g);
      const t = el("text", {x: 4, y: y + GAP_H / 2 - 3}, g);
      t.textContent = "\\u22ef " + seconds(gap) + " without a message \\u22ef";
      y += GAP_H;
    }
    const mid = y + ROW_H / 2;
    if (e.type === "message") {
      const src = e.dir === "in" ? e.hop : "conductor";
      const dst = e.dir === "in" ? "conductor" : e.hop;
      const open = waiting.has(e.seq), stuck = stuckAt.get(e.seq);
      const kind = open ? "pending" : e.kind;
      const g = el("g", {"class": "msg " + e.kind + (open ? " pending" : "") + (stuck ? " stuck" : ""),
                         "data-seq": e.seq, "data-kind": e.kind, "data-hop": e.hop}, svg);
      el("rect", {x: 0, y: y, width: width, height: ROW_H, "class": "bg"}, g);
      const x1 = laneX(src), x2 = laneX(dst);
      el("line", {x1: x1, y1: mid, x2: x2, y2: mid, "marker-end": "url(#head-" + kind + ")",
                  "stroke-width": 1.5}, g);
      const label = el("text", {x: Math.min(x1, x2) + 6, y: mid - 4, "class": "l"}, g);
      let text = (e.method || "?") + (e.id !== null && e.id !== undefined ? " #" + JSON.stringify(e.id) : "");
      if (e.kind === "error" && e.payload && e.payload.error) text += " \\u2014 " + e.payload.error.message;
      if (open) text += " \\u2014 no answer";
      label.textContent = text;
      if (stuck) {
        const hx = laneX(stuck.holder);
        el("rect", {x: hx - 5, y: mid - 5, width: 10, height: 10, "class": "mark"}, g);
        const right = hx > width / 2;  // the note goes where there is room for it
        const w = el("text", {x: right ? hx - 10 : hx + 10, y: mid + 9, "class": "w",
                              "text-anchor": right ? "end" : "start"}, g);
        w.textContent = "\\u25a0 stopped here: " + stuck.holder + " never answered";
      }
      if (e.ms !== undefined && e.kind !== "request") {
        const d = el("text", {x: Math.max(x1, x2) + 6, y: mid + 4, "class": "dur"}, g);
        d.textContent = e.ms.toFixed(1) + " ms";
      }
      const tip = el("title", {}, g);
      tip.textContent = e.from + " \\u2192 " + e.to + (e.session ? " [" + e.session + "]" : "");
      g.addEventListener("click", function () { show(e); });
    } else {
      const bad = e.event === "error" || e.event === "partial-frame" || (e.event === "exited" && e.code && !e.expected);
      const g = el("g", {"class": "life" + (bad ? " bad" : ""), "data-seq": e.seq}, svg);
      const x = laneX(e.component);
      el("circle", {cx: x, cy: mid, r: 4}, g);
      const label = el("text", {x: x + 8, y: mid + 4}, g);
      label.textContent = e.event + (e.pid ? " pid " + e.pid : "") +
        (e.code !== undefined ? " code " + e.code : "") + (e.line ? ": " + e.line : "") +
        (e.message ? ": " + e.message : "");
      g.addEventListener("click", function () { show(e); });
    }
    const t = el("text", {x: 4, y: mid + 4, "class": "t"}, svg);  // over the row's highlight
    t.textContent = "+" + ((e.time - t0) * 1000).toFixed(1) + "ms";
    y += ROW_H;
  });
  document.getElementById("count").textContent = events.length + " of " + DATA.events.length +
    " events" + (DATA.pending.length ? ", " + DATA.pending.length + " never answered" : "");
  const body = document.body.dataset;
  body.shown = String(events.length);
  body.pending = String(DATA.pending.length);
  body.gaps = String(gaps);
  body.laneWidth = String(laneW);
  // For tests and for the curious: how many lane names are fully in view right now.
  const box = chart.getBoundingClientRect();
  body.lanesVisible = String(Array.from(document.querySelectorAll(".lanehead")).filter(function (h) {
    const r = h.getBoundingClientRect();
    return r.width > 0 && r.left >= box.left && r.right <= box.right;
  }).length);
  if (selected !== null && bySeq.has(selected)) show(bySeq.get(selected));
}
function layout() {
  document.body.style.setProperty("--top", document.querySelector("header").offsetHeight +
    document.getElementById("pending").offsetHeight + "px");
  render();
}
for (const id of ["session", "method", "life", "only"]) {
  document.getElementById(id).addEventListener("input", render);
}
document.getElementById("close").addEventListener("click", function () {
  document.getElementById("detail").hidden = true;
  selected = null;
  render();
});
window.addEventListener("resize", layout);
layout();
document.body.dataset.ready = "1";
</script></body></html>
"""  # noqa: E501


# Inside <script>, `</script` ends the block and `<!--` (then `<script`) changes how the
# parser looks for its end; U+2028/2029 end a line in older JS. Outside JSON's syntax these
# characters only occur inside strings, where a \\u escape means the same character.
_SCRIPT_SAFE = {b"<": b"\\u003c", b">": b"\\u003e", b"&": b"\\u0026",
                "\u2028".encode(): b"\\u2028", "\u2029".encode(): b"\\u2029"}


def render_html(trace: Trace, title: str) -> str:
    """The page as a string.

    Data is embedded as JSON with every character that means something to the HTML parser
    (or to old JS) written as a \\u escape, so no payload can end or bend the script block.
    """
    data = msgspec.json.encode({"header": trace.header, "lanes": trace.lanes,
                                "events": trace.events,
                                "pending": [_pending(p) for p in pending(trace.events)]})
    for char, escape in _SCRIPT_SAFE.items():
        data = data.replace(char, escape)
    safe = data.decode()
    before, after = _PAGE.split("__DATA__")
    title = html.escape(title)
    return before.replace("__TITLE__", title) + safe + after.replace("__TITLE__", title)


def _pending(item: Pending) -> dict[str, object]:
    first = item.first
    return {"method": first.get("method"), "session": first.get("session"),
            "client_id": first.get("client_id"), "holder": item.holder, "path": item.path,
            "stopped": item.stopped["seq"],
            "unanswered": [e["seq"] for e in item.requests if "pair" not in e]}
