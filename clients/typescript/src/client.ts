import { type RetryInfo, type TokenSource, Transport } from "./http.js";
import { Jobs } from "./jobs.js";
import { Uploads } from "./uploads.js";

/** The client's settings. */
export interface LonghaulOptions {
  /** The API's base URL, e.g. `https://api.example.com` or `http://127.0.0.1:3000`. */
  baseUrl: string;
  /** A bearer token (JWT), or a function answering the current one (called per request). */
  token: TokenSource;
  /** The `fetch` to use (default: the global one). Tests and special environments inject theirs. */
  fetch?: typeof fetch;
  /**
   * How many times a call is sent again after a retryable answer or network error (default 4):
   * `429` and `503` for every call, honouring `Retry-After`; network errors and `500`/`502`/`504`
   * only for calls that are idempotent.
   */
  maxRetries?: number;
  /**
   * The longest wait before a retry (default 60 000 ms). An answer whose `Retry-After` asks for
   * longer is not waited out: its `LonghaulError` (with `retryAfter`) is thrown at once.
   */
  maxRetryDelayMs?: number;
  /** Called before each retry (for logs or a "retrying in 12 s" hint). */
  onRetry?: (info: RetryInfo) => void;
}

/** A client of the longhaul API. */
export class Longhaul {
  /** Submit, read, list, follow, cancel and retry jobs; their results. */
  readonly jobs: Jobs;
  /** Upload input files. */
  readonly uploads: Uploads;

  constructor(options: LonghaulOptions) {
    if (!options.baseUrl) throw new TypeError("Longhaul: baseUrl is required");
    if (options.token === undefined || options.token === "") {
      throw new TypeError("Longhaul: token is required");
    }
    const injected = options.fetch;
    const fetchImpl = injected ?? ((input: RequestInfo | URL, init?: RequestInit) => globalThis.fetch(input, init));
    const transport = new Transport({
      baseUrl: options.baseUrl,
      token: options.token,
      fetch: fetchImpl,
      maxRetries: options.maxRetries ?? 4,
      maxRetryDelayMs: options.maxRetryDelayMs ?? 60_000,
      onRetry: options.onRetry,
    });
    this.jobs = new Jobs(transport);
    this.uploads = new Uploads(transport, injected !== undefined);
  }
}
