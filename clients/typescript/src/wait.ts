import { createParser } from "eventsource-parser";

import { parseRetryAfter } from "./errors.js";
import type { Transport } from "./http.js";
import { isTerminal } from "./types.js";
import type { Job, ProgressUpdate } from "./types.js";
import { abortReason, anySignal, backoff, now, sleep } from "./util.js";

/** Options of `jobs.wait`. */
export interface WaitOptions {
  /** Called with each new progress update (never twice with the same values). */
  onProgress?: (update: ProgressUpdate) => void;
  /** Aborts the wait: every request and timer; `wait` rejects with the signal's reason. */
  signal?: AbortSignal;
  /**
   * Follow the live stream (`events_url`) when the job offers one (default `true`); `false`
   * polls `GET /jobs/{id}` only.
   */
  stream?: boolean;
  /**
   * After the stream failed `3` times within 30 s, how long `wait` polls before it tries the
   * stream again (default 30 000 ms).
   */
  streamRetryMs?: number;
}

/** Failed stream attempts within `FAILURE_WINDOW_MS` that switch `wait` to polling. */
export const STREAM_FAILURES_BEFORE_POLLING = 3;
/** The window in which failed stream attempts are counted. */
export const FAILURE_WINDOW_MS = 30_000;
/** How long `wait` polls after falling back before it tries the stream again (default). */
export const STREAM_RETRY_MS = 30_000;
/** The poll interval when `GET /jobs/{id}` names no `Retry-After`, and its bounds. */
const DEFAULT_POLL_MS = 2_000;
const MIN_POLL_MS = 1_000;
const MAX_POLL_MS = 30_000;
/** A stream that sends nothing (not even its 15-second keepalive) for this long is dropped. */
const STREAM_IDLE_MS = 45_000;
/** The longest reconnect delay a stream's `retry:` field may ask for. */
const MAX_RECONNECT_MS = 10_000;

/** How one connection to the stream ended. */
type StreamOutcome =
  /** The `status` event came (the job is terminal), or an `error` event: read the job. */
  | { kind: "ended" }
  /** The stream closed cleanly (its time limit): reconnect with `Last-Event-ID`. */
  | { kind: "closed"; reconnectMs: number }
  /** `401`: the link expired (or is not valid): get a fresh one. */
  | { kind: "expired" }
  /** It could not be opened, or broke: counts towards the fallback to polling. */
  | { kind: "failed"; retryAfterMs: number | undefined; reason: string };

/** The fields of a progress update, in a fixed order (to tell updates apart). */
function update(source: Record<string, unknown>, jobId: string, status: string): ProgressUpdate {
  const u: ProgressUpdate = {
    job_id: jobId,
    status: status as ProgressUpdate["status"],
    pct: (source.pct as number) ?? 0,
    stage: (source.stage as string | null) ?? null,
    stage_index: (source.stage_index as number | null) ?? null,
    stages_total: (source.stages_total as number | null) ?? null,
    items_done: (source.items_done as number | null) ?? null,
    items_total: (source.items_total as number | null) ?? null,
    eta: (source.eta as number | null) ?? null,
    shards: (source.shards as ProgressUpdate["shards"]) ?? null,
  };
  if (typeof source.unit === "string") u.unit = source.unit;
  return u;
}

/**
 * Follows job `jobId` to its end and answers its terminal view (`GET /jobs/{id}`).
 *
 * It reads the job, then follows its live stream (`events_url`), reconnecting with
 * `Last-Event-ID` when a stream ends and reading the job again for a fresh link when one has
 * expired (`401`). After three failed stream attempts within 30 seconds it polls
 * `GET /jobs/{id}` at the pace its `Retry-After` asks, and tries the stream again
 * `streamRetryMs` later.
 */
export async function waitForJob(
  transport: Transport,
  jobId: string,
  options: WaitOptions = {},
): Promise<Job> {
  const { onProgress, signal } = options;
  const useStream = options.stream ?? true;
  const streamRetryMs = options.streamRetryMs ?? STREAM_RETRY_MS;
  let reported = "";
  const report = (u: ProgressUpdate) => {
    const key = JSON.stringify(u);
    if (key === reported) return;
    reported = key;
    onProgress?.(u);
  };
  const path = `/jobs/${encodeURIComponent(jobId)}`;
  let lastEventId: string | undefined;
  let failures: number[] = [];
  let pollUntil = 0;

  for (;;) {
    const { body: job, response } = await transport.json<Job>({
      method: "GET",
      path,
      idempotent: true,
      signal,
    });
    report(update(job.progress as unknown as Record<string, unknown>, job.job_id, job.status));
    if (isTerminal(job.status)) return job;
    const pollMs = Math.min(
      MAX_POLL_MS,
      Math.max(MIN_POLL_MS, parseRetryAfter(response.headers.get("retry-after")) ?? DEFAULT_POLL_MS),
    );
    if (!useStream || !job.events_url || now() < pollUntil) {
      await sleep(pollMs, signal);
      continue;
    }
    // Follow this link until the job ends, the link expires or the stream fails.
    let fresh = true;
    for (;;) {
      const outcome = await streamOnce(transport, job.events_url, {
        lastEventId,
        signal,
        onEvent: (kind, id, data) => {
          if (kind === "progress") {
            if (id) lastEventId = id;
            report(update(data, jobId, String(data.status ?? job.status)));
          }
        },
      });
      if (outcome.kind === "ended") break;
      if (outcome.kind === "closed") {
        fresh = false;
        await sleep(outcome.reconnectMs, signal);
        continue;
      }
      if (outcome.kind === "expired" && !fresh) break; // read the job: a fresh link
      // A failure (or a link refused as soon as it was handed out).
      const at = now();
      failures = failures.filter((t) => at - t < FAILURE_WINDOW_MS);
      failures.push(at);
      if (failures.length >= STREAM_FAILURES_BEFORE_POLLING) {
        failures = [];
        pollUntil = at + streamRetryMs;
        await sleep(pollMs, signal);
      } else {
        const retryAfterMs = outcome.kind === "failed" ? outcome.retryAfterMs : undefined;
        await sleep(Math.min(MAX_POLL_MS, retryAfterMs ?? backoff(failures.length)), signal);
      }
      break;
    }
  }
}

/** Opens the stream at `url` once and reads it to its end. */
async function streamOnce(
  transport: Transport,
  url: string,
  options: {
    lastEventId: string | undefined;
    signal: AbortSignal | undefined;
    onEvent: (kind: string, id: string | undefined, data: Record<string, unknown>) => void;
  },
): Promise<StreamOutcome> {
  const outer = options.signal;
  const idle = new AbortController();
  const { signal, dispose } = anySignal([outer, idle.signal]);
  let timer: ReturnType<typeof setTimeout> | undefined;
  const arm = () => {
    clearTimeout(timer);
    timer = setTimeout(() => idle.abort(new Error("the stream sent nothing for too long")), STREAM_IDLE_MS);
  };
  const failed = (reason: string, retryAfterMs?: number): StreamOutcome => ({
    kind: "failed",
    retryAfterMs,
    reason,
  });
  try {
    arm();
    // The link carries its own token: the API's bearer token is never sent there.
    const headers: Record<string, string> = { Accept: "text/event-stream" };
    if (options.lastEventId) headers["Last-Event-ID"] = options.lastEventId;
    let response: Response;
    try {
      response = await transport.options.fetch(url, { headers, cache: "no-store", signal });
    } catch (err) {
      if (outer?.aborted) throw abortReason(outer);
      return failed(`could not connect: ${String(err)}`);
    }
    if (!response.ok) {
      await response.body?.cancel().catch(() => undefined);
      if (response.status === 401) return { kind: "expired" };
      return failed(
        `HTTP ${response.status}`,
        parseRetryAfter(response.headers.get("retry-after")),
      );
    }
    const type = response.headers.get("content-type") ?? "";
    if (!type.startsWith("text/event-stream") || !response.body) {
      await response.body?.cancel().catch(() => undefined);
      return failed(`not an event stream (${type || "no content type"})`);
    }
    let ended = false;
    let reconnectMs = 1_000;
    const parser = createParser({
      onRetry: (ms) => {
        reconnectMs = Math.min(MAX_RECONNECT_MS, Math.max(0, ms));
      },
      onEvent: (event) => {
        if (ended) return;
        let data: Record<string, unknown>;
        try {
          data = JSON.parse(event.data) as Record<string, unknown>;
        } catch {
          return;
        }
        if (event.event === "status" || event.event === "error") {
          ended = true;
          return;
        }
        options.onEvent(event.event ?? "message", event.id, data);
      },
    });
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        arm();
        parser.feed(value);
        if (ended) {
          await reader.cancel().catch(() => undefined);
          return { kind: "ended" };
        }
      }
    } catch (err) {
      if (outer?.aborted) throw abortReason(outer);
      return failed(`the stream broke: ${String(err)}`);
    }
    return { kind: "closed", reconnectMs };
  } finally {
    clearTimeout(timer);
    dispose();
  }
}
