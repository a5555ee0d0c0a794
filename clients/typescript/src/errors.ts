import type { Problem } from "./types.js";

/**
 * An error answer of the API (or of a presigned upload URL), carrying its RFC 9457 problem:
 * branch on `type` (`/problems/<slug>`) and `status`. An answer that is not a problem (the
 * gateway's `401 {"message": "Unauthorized"}`, an S3 error) is given `type` `about:blank`,
 * as RFC 9457 says, with its message as `title` and `detail`.
 */
export class LonghaulError extends Error {
  /** The HTTP status. */
  readonly status: number;
  /** `/problems/<slug>`, or `about:blank` for an answer that was not a problem. */
  readonly type: string;
  /** Short, fixed summary of the problem type. */
  readonly title: string;
  /** This occurrence, in words. */
  readonly detail: string;
  /** The whole problem, extension members (e.g. `status_now`, `job_id`) included. */
  readonly problem: Problem;
  /** Seconds the answer's `Retry-After` asked to wait, when it named one. */
  readonly retryAfter: number | undefined;

  constructor(problem: Problem, retryAfter?: number) {
    super(`${problem.title} (HTTP ${problem.status}): ${problem.detail}`);
    this.name = "LonghaulError";
    this.status = problem.status;
    this.type = problem.type;
    this.title = problem.title;
    this.detail = problem.detail;
    this.problem = problem;
    this.retryAfter = retryAfter;
  }

  /** The error for a response that was not a success (its body is read). */
  static async fromResponse(response: Response): Promise<LonghaulError> {
    let text = "";
    try {
      text = await response.text();
    } catch {
      // The body could not be read: the status says enough.
    }
    let body: unknown = undefined;
    try {
      body = text ? JSON.parse(text) : undefined;
    } catch {
      body = undefined;
    }
    const retryAfterMs = parseRetryAfter(response.headers.get("retry-after"));
    const retryAfter = retryAfterMs === undefined ? undefined : retryAfterMs / 1000;
    const status = response.status;
    if (isProblem(body)) {
      return new LonghaulError({ ...body, status: body.status || status }, retryAfter);
    }
    const message =
      body && typeof body === "object" && typeof (body as { message?: unknown }).message === "string"
        ? (body as { message: string }).message
        : text.trim().slice(0, 500) || response.statusText || `HTTP ${status}`;
    const title = response.statusText || message;
    return new LonghaulError({ type: "about:blank", title, status, detail: message }, retryAfter);
  }
}

/** The API could not be reached (or the connection broke), after the retries the call allows. */
export class LonghaulNetworkError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "LonghaulNetworkError";
  }
}

function isProblem(body: unknown): body is Problem {
  if (!body || typeof body !== "object") return false;
  const b = body as Record<string, unknown>;
  return typeof b.type === "string" && typeof b.title === "string";
}

/**
 * A `Retry-After` value in milliseconds: delay-seconds or an HTTP date; `undefined` when
 * absent or unreadable.
 */
export function parseRetryAfter(value: string | null | undefined): number | undefined {
  if (value === null || value === undefined) return undefined;
  const text = value.trim();
  if (/^\d+$/.test(text)) return Number(text) * 1000;
  const at = Date.parse(text);
  if (Number.isNaN(at)) return undefined;
  return Math.max(0, at - Date.now());
}
