/**
 * `@longhaul/client`: a client of the longhaul API for browsers and Node ≥ 20.
 *
 * ```ts
 * import { Longhaul } from "@longhaul/client";
 * const lh = new Longhaul({ baseUrl, token });
 * const job = await lh.jobs.submit({ type: "demo", params: { items: 50 } });
 * const done = await lh.jobs.wait(job.job_id, { onProgress: (p) => console.log(p.pct) });
 * ```
 */
export { Longhaul, type LonghaulOptions } from "./client.js";
export { LonghaulError, LonghaulNetworkError } from "./errors.js";
export type { RetryInfo, TokenSource } from "./http.js";
export type {
  CallOptions,
  Jobs,
  ListOptions,
  Retried,
  SubmitOptions,
  Submitted,
} from "./jobs.js";
export type { UploadData, UploadOptions, UploadProgress, Uploads } from "./uploads.js";
export {
  FAILURE_WINDOW_MS,
  STREAM_FAILURES_BEFORE_POLLING,
  STREAM_RETRY_MS,
  type WaitOptions,
} from "./wait.js";
export * from "./types.js";
export type { components, operations, paths } from "./generated/openapi.js";
