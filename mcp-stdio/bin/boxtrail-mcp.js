#!/usr/bin/env node
// boxtrail's agent tools over MCP's stdio transport: what an agent host spawns
// (`node bin/boxtrail-mcp.js`, with BOXTRAIL_URL and BOXTRAIL_API_KEY) when it speaks MCP on a
// child's stdin and stdout. Each request is passed to the server's own /mcp (streamable
// HTTP), so the tools are exactly the server's: the list as the server gives it (names,
// inputs, outputs, descriptions, annotations), each result as it comes (structured content
// included), logs_tail's progress notifications passed on, a cancellation passed on.
//
// Failures are tool errors with what to do, never a call that hangs: a key the server
// refuses, a server that cannot be reached (CONNECT_TIMEOUT_MS), a connection lost mid-call
// (a server restarted: the call ends once the transport gives up on the stream). The next
// call connects again.

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import {
  CallToolRequestSchema,
  CallToolResultSchema,
  ErrorCode,
  ListToolsRequestSchema,
  McpError,
} from "@modelcontextprotocol/sdk/types.js";

const VERSION = "0.1.0";
const CONNECT_TIMEOUT_MS = 10_000;
// A call may take its own `seconds` (logs_tail: up to 300, quiet when no row arrives) and
// this much more; progress notifications (rows) keep it alive too.
const CALL_MARGIN_MS = 60_000;
const MAX_CALL_SECONDS = 300;

function callTimeout(args) {
  const seconds = Number(args?.seconds);
  const wait = Number.isFinite(seconds) ? Math.min(Math.max(seconds, 0), MAX_CALL_SECONDS) : 0;
  return CALL_MARGIN_MS + wait * 1000;
}

const base = (process.env.BOXTRAIL_URL || "http://127.0.0.1:8780").replace(/\/+$/, "");
const key = process.env.BOXTRAIL_API_KEY || "";

let upstream = null; // Promise<Client> while connected or connecting
const inFlight = new Set(); // AbortControllers of the calls on the current connection

function problem(err) {
  const text = err instanceof Error ? err.message : String(err);
  if (/\b401\b|unauthorized/i.test(text)) {
    return `boxtrail refused the API key (401): set BOXTRAIL_API_KEY to a key of yours with the read scope (${text})`;
  }
  if (/\b403\b|insufficient_scope/i.test(text)) {
    return `boxtrail refused the call (403): the API key lacks the read scope (${text})`;
  }
  if (/request timed out/i.test(text)) {  // the server took the call and did not answer
    return `boxtrail did not answer the call in time (${text})`;
  }
  if (/fetch failed|ECONNREFUSED|ENOTFOUND|EHOSTUNREACH|ETIMEDOUT|timed out|timeout/i.test(text)) {
    return `boxtrail is not reachable at ${base} (BOXTRAIL_URL): ${text}`;
  }
  return text.startsWith("the connection to boxtrail") ? text : `boxtrail: ${text}`;
}

function drop(reason) {
  const gone = upstream;
  upstream = null;
  for (const controller of inFlight) controller.abort(reason);
  inFlight.clear();
  if (gone) gone.then((client) => client.close()).catch(() => {});
}

function connect() {
  if (upstream) return upstream;
  const client = new Client({ name: "boxtrail-mcp", version: VERSION });
  const transport = new StreamableHTTPClientTransport(new URL(base + "/mcp"), {
    requestInit: { headers: key ? { Authorization: `Bearer ${key}` } : {} },
    reconnectionOptions: { initialReconnectionDelay: 500, maxReconnectionDelay: 2000,
                           reconnectionDelayGrowFactor: 2, maxRetries: 2 },
  });
  const made = client.connect(transport, { timeout: CONNECT_TIMEOUT_MS }).then(() => {
    // A stream lost for good (a server restarted, the network): end the calls on it.
    client.onerror = (err) => {
      if (upstream === made) drop(new Error(`the connection to boxtrail was lost (${err.message}); call again`));
    };
    return client;
  });
  upstream = made;
  made.catch(() => { if (upstream === made) upstream = null; });
  return made;
}

const server = new Server({ name: "boxtrail", version: VERSION },
                          { capabilities: { tools: {} } });

server.setRequestHandler(ListToolsRequestSchema, async (request) => {
  try {
    const client = await connect();
    return await client.listTools(request.params);
  } catch (err) {
    drop(err);
    throw new McpError(ErrorCode.InternalError, problem(err));
  }
});

server.setRequestHandler(CallToolRequestSchema, async (request, extra) => {
  const controller = new AbortController();
  const cancelled = () => controller.abort(extra.signal.reason);
  extra.signal.addEventListener("abort", cancelled);
  const token = request.params._meta?.progressToken;
  try {
    const client = await connect();
    inFlight.add(controller);
    return await client.callTool(
      { name: request.params.name, arguments: request.params.arguments },
      CallToolResultSchema,
      {
        signal: controller.signal,
        timeout: callTimeout(request.params.arguments),
        resetTimeoutOnProgress: true,
        onprogress: token === undefined ? undefined : (p) => extra.sendNotification({
          method: "notifications/progress",
          params: { ...p, progressToken: token },
        }),
      });
  } catch (err) {
    if (extra.signal.aborted) throw err; // the host cancelled: it wants no answer
    if (!(err instanceof McpError) || err.code !== ErrorCode.InvalidParams) drop(err);
    return { content: [{ type: "text", text: problem(controller.signal.reason ?? err) }],
             isError: true };
  } finally {
    inFlight.delete(controller);
    extra.signal.removeEventListener("abort", cancelled);
  }
});

await server.connect(new StdioServerTransport());
