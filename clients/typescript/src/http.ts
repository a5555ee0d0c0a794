import { LonghaulError, LonghaulNetworkError, parseRetryAfter } from "./errors.js";
import { abortReason, backoff, sleep, throwIfAborted } from "./util.js";

/** A bearer token, or a function that answers the current one (called for every request). */
export type TokenSource = string | (() => string | Promise<string>);

/** What the client tells `onRetry` before it waits and sends a request again. */
export interface RetryInfo {
  /** `METHOD path` of the request. */
  request: string;
  /** 1 for the first retry. */
  attempt: number;
  /** How long the client waits before it. */
  delayMs: number;
  /** Why: the error answer, or the network error. */
  error: unknown;
}

/** The transport's settings. */
export interface TransportOptions {
  baseUrl: string;
  token: TokenSource;
  fetch: typeof fetch;
  maxRetries: number;
  maxRetryDelayMs: number;
  onRetry: ((info: RetryInfo) => void) | undefined;
}

/** One API call. */
export interface Call {
  method: "GET" | "POST" | "PUT" | "DELETE";
  path: string;
  query?: Record<string, string | number | undefined> | undefined;
  body?: unknown;
  headers?: Record<string, string>;
  /**
   * Whether sending the call twice does what sending it once does: then network errors and
   * 500/502/504 are retried too. `429` and `503` (the request was refused, not done) are
   * retried for every call.
   */
  idempotent: boolean;
  /** Retry `409 /problems/request-in-flight` (an earlier try of this very request still running). */
  retryInFlight?: boolean;
  /** `manual` to see a redirect instead of following it. */
  redirect?: RequestRedirect;
  /** Which answers are the call's success (default: 2xx). */
  success?: (response: Response) => boolean;
  signal?: AbortSignal | undefined;
}

/**
 * Sends API calls: the bearer token, JSON bodies, problem+json errors, and bounded retries
 * that honour `Retry-After`.
 */
export class Transport {
  readonly options: TransportOptions;

  constructor(options: TransportOptions) {
    this.options = { ...options, baseUrl: options.baseUrl.replace(/\/+$/, "") };
  }

  /** The absolute URL of `path` (already absolute URLs are kept). */
  url(path: string, query?: Call["query"]): string {
    const url = new URL(/^https?:\/\//.test(path) ? path : `${this.options.baseUrl}${path}`);
    for (const [name, value] of Object.entries(query ?? {})) {
      if (value !== undefined && value !== "") url.searchParams.set(name, String(value));
    }
    return url.toString();
  }

  private async token(): Promise<string> {
    const token = this.options.token;
    return typeof token === "function" ? await token() : token;
  }

  /** Sends `call` and answers its successful response; throws a `LonghaulError` otherwise. */
  async send(call: Call): Promise<Response> {
    const { signal } = call;
    const url = this.url(call.path, call.query);
    const what = `${call.method} ${call.path}`;
    const success = call.success ?? ((r: Response) => r.ok);
    const maxRetries = this.options.maxRetries;
    let refreshedToken = false;
    for (let attempt = 0; ; attempt++) {
      throwIfAborted(signal);
      const headers: Record<string, string> = {
        Accept: "application/json, application/problem+json",
        ...call.headers,
        Authorization: `Bearer ${await this.token()}`,
      };
      let body: string | undefined;
      if (call.body !== undefined) {
        headers["Content-Type"] = "application/json";
        body = JSON.stringify(call.body);
      }
      let response: Response;
      try {
        response = await this.options.fetch(url, {
          method: call.method,
          headers,
          body,
          redirect: call.redirect ?? "follow",
          cache: "no-store",
          signal,
        });
      } catch (err) {
        if (signal?.aborted) throw abortReason(signal);
        const delay = backoff(attempt);
        if (!call.idempotent || attempt >= maxRetries || delay > this.options.maxRetryDelayMs) {
          throw new LonghaulNetworkError(`${what}: the API could not be reached (${describe(err)})`, {
            cause: err,
          });
        }
        this.options.onRetry?.({ request: what, attempt: attempt + 1, delayMs: delay, error: err });
        await sleep(delay, signal);
        continue;
      }
      if (success(response)) return response;
      const error = await LonghaulError.fromResponse(response);
      if (response.status === 401 && typeof this.options.token === "function" && !refreshedToken) {
        // The token may have expired between the function's answer and the request: ask once more.
        refreshedToken = true;
        continue;
      }
      const retryable =
        response.status === 429 ||
        response.status === 503 ||
        (call.idempotent && [500, 502, 504].includes(response.status)) ||
        (call.retryInFlight === true &&
          response.status === 409 &&
          error.type === "/problems/request-in-flight");
      if (!retryable || attempt >= maxRetries) throw error;
      const delay =
        error.retryAfter !== undefined ? error.retryAfter * 1000 : backoff(attempt);
      // A wait longer than the client may make is not made: the caller decides.
      if (delay > this.options.maxRetryDelayMs) throw error;
      this.options.onRetry?.({ request: what, attempt: attempt + 1, delayMs: delay, error });
      await sleep(delay, signal);
    }
  }

  /** Sends `call` and answers its JSON body and the response. */
  async json<T>(call: Call): Promise<{ body: T; response: Response }> {
    const response = await this.send(call);
    const body = (await response.json()) as T;
    return { body, response };
  }
}

/** A short description of a thrown value. */
export function describe(err: unknown): string {
  if (err instanceof Error) {
    const cause = (err as { cause?: unknown }).cause;
    return cause instanceof Error ? `${err.message}: ${cause.message}` : err.message;
  }
  return String(err);
}

export { parseRetryAfter };
