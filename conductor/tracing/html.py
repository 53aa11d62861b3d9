"""`trace html`: one self-contained page (no network).

Swim lanes, arrows, request/answer pairing, JSON on click.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    from conductor.tracing.view import Trace

# The page's lines are HTML, CSS and JS kept byte-for-byte, so E501 is waived for the literal.
_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'">
<title>__TITLE__</title>
<style>
body{font:13px/1.4 system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
header{padding:8px 12px;background:#223;color:#eee;display:flex;gap:16px;align-items:center;position:sticky;top:0;z-index:2}
header h1{font-size:15px;margin:0 12px 0 0}
header label{display:flex;gap:6px;align-items:center}
#wrap{display:flex;height:calc(100vh - 44px)}
#chart{flex:1;overflow:auto}
#detail{width:38%;overflow:auto;border-left:1px solid #ccc;background:#fff;padding:8px;margin:0;font:12px/1.35 ui-monospace,monospace;white-space:pre-wrap}
svg text{font:12px system-ui,sans-serif}
.lane{stroke:#bbb;stroke-dasharray:4 3}
.lanehead{font-weight:bold;text-anchor:middle}
.msg{cursor:pointer}
.msg:hover .bg{fill:#eef3ff}
.bg{fill:transparent}
.request line{stroke:#1f6fd1}.request text.l{fill:#1f5fb0}
.response line{stroke:#2a9d4b}.response text.l{fill:#1d7a39}
.notification line{stroke:#888}.notification text.l{fill:#666}
.error line{stroke:#d22;stroke-width:2}.error text.l{fill:#c00;font-weight:bold}
.life circle{fill:#e0a000}.life.bad circle{fill:#d22}.life text{fill:#8a6d00}
.selected .bg{fill:#ffe9a8}.paired .bg{fill:#fff3cf}
.t{fill:#999;font-size:11px}
.dur{fill:#a0a}
</style></head>
<body data-ready="0" data-errors="0">
<header><h1>__TITLE__</h1>
<label>session <select id="session"><option value="">all</option></select></label>
<label>method <input id="method" placeholder="glob, e.g. session/*" size="18"></label>
<label><input type="checkbox" id="life" checked> lifecycle</label>
<span id="count"></span></header>
<div id="wrap"><div id="chart"></div><pre id="detail">Click a message to see its JSON.</pre></div>
<script type="application/json" id="trace-data">__DATA__</script>
<script>
"use strict";
window.addEventListener("error", function () {
  document.body.dataset.errors = String(Number(document.body.dataset.errors) + 1);
});
const DATA = JSON.parse(document.getElementById("trace-data").textContent);
const SVGNS = "http://www.w3.org/2000/svg";
const LANE_W = 170, LEFT = 70, ROW_H = 22, TOP = 36;
const bySeq = new Map(DATA.events.map(function (e) { return [e.seq, e]; }));
const t0 = DATA.header.time || (DATA.events.length ? DATA.events[0].time : 0);
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
  return LEFT + (i < 0 ? 0 : i) * LANE_W + LANE_W / 2;
}
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
  const re = method ? globToRegExp(method) : null;
  return DATA.events.filter(function (e) {
    if (e.type !== "message") return life && !session && !re;
    if (session && e.session !== session) return false;
    if (re && !re.test(String(e.method))) return false;
    return true;
  });
}
function show(e) {
  selected = e.seq;
  document.getElementById("detail").textContent = JSON.stringify(e, null, 2);
  for (const g of document.querySelectorAll(".msg")) {
    const seq = Number(g.dataset.seq);
    g.classList.toggle("selected", seq === e.seq);
    g.classList.toggle("paired", e.pair !== undefined && seq === e.pair);
  }
}
function render() {
  const events = visible();
  const chart = document.getElementById("chart");
  chart.textContent = "";
  const width = LEFT + DATA.lanes.length * LANE_W + 20;
  const height = TOP + events.length * ROW_H + 20;
  const svg = el("svg", {width: width, height: height, id: "timeline"}, chart);
  const defs = el("defs", {}, svg);
  for (const [k, c] of [["request", "#1f6fd1"], ["response", "#2a9d4b"],
                        ["notification", "#888"], ["error", "#d22"]]) {
    const m = el("marker", {id: "head-" + k, viewBox: "0 0 10 10", refX: 10, refY: 5,
                            markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse"}, defs);
    el("path", {d: "M0,0 L10,5 L0,10 z", fill: c}, m);
  }
  DATA.lanes.forEach(function (name) {
    const x = laneX(name);
    const g = el("g", {"class": "lanegroup", "data-lane": name}, svg);
    el("line", {x1: x, y1: TOP - 8, x2: x, y2: height, "class": "lane"}, g);
    el("text", {x: x, y: 18, "class": "lanehead"}, g).textContent = name;
  });
  events.forEach(function (e, i) {
    const y = TOP + i * ROW_H + ROW_H / 2;
    const t = el("text", {x: 4, y: y + 4, "class": "t"}, svg);
    t.textContent = "+" + ((e.time - t0) * 1000).toFixed(1) + "ms";
    if (e.type === "message") {
      const src = e.dir === "in" ? e.hop : "conductor";
      const dst = e.dir === "in" ? "conductor" : e.hop;
      const g = el("g", {"class": "msg " + e.kind, "data-seq": e.seq, "data-kind": e.kind,
                         "data-hop": e.hop}, svg);
      el("rect", {x: 0, y: y - ROW_H / 2, width: width, height: ROW_H, "class": "bg"}, g);
      const x1 = laneX(src), x2 = laneX(dst);
      el("line", {x1: x1, y1: y, x2: x2, y2: y, "marker-end": "url(#head-" + e.kind + ")",
                  "stroke-width": 1.5}, g);
      const label = el("text", {x: Math.min(x1, x2) + 6, y: y - 4, "class": "l"}, g);
      let text = (e.method || "?") + (e.id !== null && e.id !== undefined ? " #" + JSON.stringify(e.id) : "");
      if (e.kind === "error" && e.payload && e.payload.error) text += " \\u2014 " + e.payload.error.message;
      label.textContent = text;
      if (e.ms !== undefined && e.kind !== "request") {
        const d = el("text", {x: Math.max(x1, x2) + 6, y: y + 4, "class": "dur"}, g);
        d.textContent = e.ms.toFixed(1) + " ms";
      }
      const tip = el("title", {}, g);
      tip.textContent = e.from + " \\u2192 " + e.to + (e.session ? " [" + e.session + "]" : "");
      g.addEventListener("click", function () { show(e); });
    } else {
      const bad = e.event === "error" || (e.event === "exited" && e.code && !e.expected);
      const g = el("g", {"class": "life" + (bad ? " bad" : ""), "data-seq": e.seq}, svg);
      const x = laneX(e.component);
      el("circle", {cx: x, cy: y, r: 4}, g);
      const label = el("text", {x: x + 8, y: y + 4}, g);
      label.textContent = e.event + (e.pid ? " pid " + e.pid : "") +
        (e.code !== undefined ? " code " + e.code : "") + (e.line ? ": " + e.line : "") +
        (e.message ? ": " + e.message : "");
      g.addEventListener("click", function () { show(e); });
    }
  });
  document.getElementById("count").textContent = events.length + " of " + DATA.events.length + " events";
  document.body.dataset.shown = String(events.length);
  if (selected !== null && bySeq.has(selected)) show(bySeq.get(selected));
}
for (const id of ["session", "method", "life"]) {
  document.getElementById(id).addEventListener("input", render);
}
render();
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
                                "events": trace.events})
    for char, escape in _SCRIPT_SAFE.items():
        data = data.replace(char, escape)
    safe = data.decode()
    before, after = _PAGE.split("__DATA__")
    title = html.escape(title)
    return before.replace("__TITLE__", title) + safe + after.replace("__TITLE__", title)
