// The official TypeScript ACP SDK (v1 client) calling every agent method through a chain and
// serving every client method, over stdio:   node ts_sdk_full_client.mjs ARGV...
// $ACP_SDK_DIR is the SDK's package directory. Prints one JSON object: the answers, the
// text the agent streamed, and the client methods it was asked, in order.
import { spawn } from "node:child_process";
import { Readable, Writable } from "node:stream";
import { pathToFileURL } from "node:url";

const acp = await import(pathToFileURL(`${process.env.ACP_SDK_DIR}/dist/acp.js`).href);
const argv = process.argv.slice(2);
const child = spawn(argv[0], argv.slice(1), { stdio: ["pipe", "pipe", "inherit"] });
const stream = acp.ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout));
const said = [];
const asked = [];
const C = acp.methods.client;
const ask = (name, answer) => (ctx) => { asked.push(name); return answer(ctx.params); };
const app = acp.client({ name: "ts-sdk-full-client" })
  .onNotification(C.session.update, (ctx) => { said.push(ctx.params.update.content?.text); })
  .onRequest(C.fs.readTextFile, ask("fs/read_text_file", () => ({ content: "R" })))
  .onRequest(C.fs.writeTextFile, ask("fs/write_text_file", () => ({})))
  .onRequest(C.terminal.create, ask("terminal/create", () => ({ terminalId: "t1" })))
  .onRequest(C.terminal.output, ask("terminal/output", () => ({ output: "OUT", truncated: false })))
  .onRequest(C.terminal.waitForExit, ask("terminal/wait_for_exit", () => ({ exitCode: 0 })))
  .onRequest(C.terminal.kill, ask("terminal/kill", () => ({})))
  .onRequest(C.terminal.release, ask("terminal/release", () => ({})))
  .onRequest("_x/agent_ask", (p) => p, ask("_x/agent_ask", (p) => ({ got: p })))
  .onNotification("_x/agent_note", (p) => p, (ctx) => { asked.push("_x/agent_note"); });
const answers = await app.connectWith(stream, async (ctx) => {
  const A = acp.methods.agent;
  const r = {};
  r.initialize = await ctx.request(A.initialize, {
    protocolVersion: 1, _meta: { trace: "t1" },
    clientCapabilities: { fs: { readTextFile: true, writeTextFile: true }, terminal: true } });
  const { sessionId } = r.new = await ctx.request(A.session.new,
                                                  { cwd: "/", mcpServers: [], _meta: { k: 1 } });
  r.setMode = await ctx.request(A.session.setMode, { sessionId, modeId: "code" });
  r.setConfigOption = await ctx.request(A.session.setConfigOption,
                                        { sessionId, configId: "model", value: "big" });
  r.prompt = await ctx.request(A.session.prompt,
                               { sessionId, prompt: [{ type: "text", text: "go" }], _meta: { p: 2 } });
  r.ext = await ctx.request("_x/client_ask", { z: 3, _meta: { e: 4 } });
  await ctx.notify("_x/client_note", { y: 5 });
  r.load = await ctx.request(A.session.load, { sessionId, cwd: "/", mcpServers: [] });
  const hang = ctx.request(A.session.prompt, { sessionId, prompt: [{ type: "text", text: "hang" }] });
  while (said.length < 3) await new Promise((resolve) => setTimeout(resolve, 20));
  await ctx.notify(A.session.cancel, { sessionId });
  r.cancelled = await hang;
  return r;
});
console.log(JSON.stringify({ answers, said, asked }));
child.stdin.end();
process.exit(0);
