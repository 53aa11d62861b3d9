// @thinkwell/conductor as a stdio conductor, for bench/run_bench.py.
//
//   node bench/node/thinkwell.mjs '["python3","proxy.py"]' ... '["python3","agent.py"]'
//
// Each argument is one component's argv as a JSON array; the last one is the agent. The
// package is a library: this is the launcher it leaves to its user, with the editor on our
// own stdin/stdout (newline-delimited JSON-RPC, as its StdioConnector speaks to children).
// Install the package with `npm install --prefix bench/node` (see package.json).
import { createInterface } from "node:readline";
import { Conductor, fromCommands } from "@thinkwell/conductor";

const commands = process.argv.slice(2).map((arg) => {
  const [command, ...args] = JSON.parse(arg);
  return { command, args };
});

const editor = {
  async connect() {
    const lines = createInterface({ input: process.stdin, crlfDelay: Infinity });
    return {
      send(message) {
        process.stdout.write(JSON.stringify(message) + "\n");
      },
      messages: (async function* () {
        for await (const line of lines) {
          if (line.trim()) yield JSON.parse(line);
        }
      })(),
      async close() {
        lines.close();
      },
    };
  },
};

await new Conductor({ instantiator: fromCommands(commands) }).connect(editor);
