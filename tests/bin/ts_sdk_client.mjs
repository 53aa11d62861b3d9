// The official TypeScript ACP SDK as a remote client of `acp-conductor serve`:
//   node [--experimental-websocket] ts_sdk_client.mjs http|ws URL "prompt" [SESSION_ID]
// $ACP_SDK_DIR is the SDK's package directory; $ACP_TOKEN the bearer token. Over ws it
// authenticates as a browser must (the subprotocol `bearer.TOKEN`, no headers); over http
// with `Authorization`. With SESSION_ID it loads that session (session/load) instead of
// opening one. Prints the agent's text and `stop: <reason>`.
import { pathToFileURL } from "node:url";

const [mode, url, text, load] = process.argv.slice(2);
const sdk = process.env.ACP_SDK_DIR;
const token = process.env.ACP_TOKEN;
const acp = await import(pathToFileURL(`${sdk}/dist/acp.js`).href);
let stream;
if (mode === "ws") {
  const { createWebSocketStream } = await import(pathToFileURL(`${sdk}/dist/ws-stream.js`).href);
  stream = createWebSocketStream(url, { protocols: ["acp", `bearer.${token}`] });
} else {
  const { createHttpStream } = await import(pathToFileURL(`${sdk}/dist/http-stream.js`).href);
  stream = createHttpStream(url, { headers: { Authorization: `Bearer ${token}` } });
}
const said = [];
const result = await acp
  .client({ name: "ts-sdk-client" })
  .onNotification(acp.methods.client.session.update, (ctx) => {
    const update = ctx.params.update;
    if (update.sessionUpdate === "agent_message_chunk" && update.content.type === "text") {
      said.push(update.content.text);
    }
  })
  .connectWith(stream, async (ctx) => {
    await ctx.request(acp.methods.agent.initialize,
                      { protocolVersion: acp.PROTOCOL_VERSION, clientCapabilities: {} });
    let sessionId = load;
    if (load) {
      await ctx.request(acp.methods.agent.session.load,
                        { sessionId, cwd: process.cwd(), mcpServers: [] });
    } else {
      ({ sessionId } = await ctx.request(acp.methods.agent.session.new,
                                         { cwd: process.cwd(), mcpServers: [] }));
    }
    return ctx.request(acp.methods.agent.session.prompt, {
      sessionId, prompt: [{ type: "text", text }] });
  });
console.log(said.join(""));
console.log(`stop: ${result.stopReason}`);
process.exit(0);
