// Start Portkey's gateway bound to 127.0.0.1 only: its start-server.js passes no hostname to
// @hono/node-server, which then listens on every interface. PORTKEY_ENTRY is start-server.js.
import net from "node:net";
import { pathToFileURL } from "node:url";

const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  if (args[0] !== null && typeof args[0] === "object") {
    args[0] = { ...args[0], host: "127.0.0.1" };
  } else {
    const callback = typeof args[args.length - 1] === "function" ? args.pop() : undefined;
    args = [args[0], "127.0.0.1", ...(callback ? [callback] : [])];
  }
  return listen.apply(this, args);
};

await import(pathToFileURL(process.env.PORTKEY_ENTRY).href);
