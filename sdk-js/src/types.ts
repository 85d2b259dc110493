/** The shapes the SDK sends: one event of the ingest body (see DESIGN.md, "Ingest"). */

export type Level = 'debug' | 'info' | 'warn' | 'error';
export type ConsoleMethod = 'debug' | 'log' | 'info' | 'warn' | 'error';
export type Scalar = string | number | boolean | null;
export type Attrs = Record<string, Scalar>;

export interface ErrorInfo {
  type: string;
  message: string;
  stack?: string;
}

export interface LogEvent {
  /** Epoch milliseconds. */
  ts: number;
  level: Level;
  message: string;
  url?: string;
  attrs?: Attrs;
  error?: ErrorInfo;
}

export interface Options {
  /** The project's public ingest key (`bti_...`). */
  ingestKey: string;
  /** Base URL of the boxtrail server, e.g. `https://logs.example.com`. */
  endpoint: string;
  release?: string;
  /** Box id; by default read from a page host `{box}.box.<domain>`. */
  boxId?: string;
  /** Console methods to capture: `true` (all five, the default), `false`, or a list. */
  captureConsole?: boolean | ConsoleMethod[];
  /** Uncaught errors and unhandled rejections (default `true`). */
  captureErrors?: boolean;
  /** Failed `fetch` / XHR: network errors and HTTP 5xx (default `false`). */
  captureNetwork?: boolean;
  /** Share of sessions whose logs are sent, 0..1 (default 1). */
  sampleRate?: number;
  /** Called with each event; return it (changed or not) to send it, or a falsy value to drop it. */
  beforeSend?: (event: LogEvent) => LogEvent | null | undefined | false;
  /** Send once this many events are queued (default 50). */
  batchSize?: number;
  /** ... or once the queued events take this many characters of JSON (default 16384). */
  batchBytes?: number;
  /** ... or this many ms after the first queued event (default 1000). */
  flushInterval?: number;
  /** Events kept while they cannot be sent; past it the oldest are dropped (default 2000,
   * at most 20000). */
  maxQueue?: number;
  /** Hard cap per minute, counted apart for errors and for other levels (default 3000). */
  maxEventsPerMinute?: number;
  /** Messages, error messages and stacks are cut to this many characters (default 8192). */
  maxMessageLength?: number;
  /** Gzip bodies with CompressionStream where the browser has it (default `true`). */
  gzip?: boolean;
}
