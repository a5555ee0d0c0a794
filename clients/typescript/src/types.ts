/**
 * The API's types, generated from docs/openapi.json (`npm run generate` writes
 * `generated/openapi.ts`; a test checks it is current), under the names the client uses, and
 * the live stream's events, which the OpenAPI document does not describe (the stream is the
 * events function's URL, not a route of the HTTP API).
 */
import type { components, operations } from "./generated/openapi.js";

type Schemas = components["schemas"];

/** Where a job is in its life. */
export type JobStatus = Schemas["JobStatus"];
/** A job: its status, progress and history (`GET /jobs/{id}`). */
export type Job = Schemas["Job"];
/** How far a job is. */
export type Progress = Schemas["Progress"];
/** How the shards of a fanned-out stage stand (`Progress.shards`). */
export type ShardCounts = Schemas["ShardCounts"];
/** A job in a listing. */
export type JobSummary = Schemas["JobSummary"];
/** One page of the caller's jobs (`GET /jobs`). */
export type JobList = Schemas["JobList"];
/** A created (202) or replayed (200) submission. */
export type Accepted = Schemas["Accepted"];
/** The body of `POST /jobs`. */
export type SubmitRequest = Schemas["SubmitRequest"];
/** The answer of a cancellation. */
export type CancelAccepted = Schemas["CancelAccepted"];
/** The answer of a pause or a resume. */
export type PauseAccepted = Schemas["PauseAccepted"];
/** The answer of a signal. */
export type SignalAccepted = Schemas["SignalAccepted"];
/** A presigned PUT for one input file (`POST /uploads`). */
export type Upload = Schemas["Upload"];
/** An RFC 9457 problem: every error the API answers. */
export type Problem = Schemas["Problem"];
/** `GET /job-types`. */
export type JobTypeList = Schemas["JobTypeList"];
/** One job type this deployment accepts. */
export type JobType = Schemas["JobType"];
/** `GET /jobs/{id}/deliveries`. */
export type DeliveryList = Schemas["DeliveryList"];
/** A job's priority among its owner's waiting jobs. */
export type Priority = NonNullable<SubmitRequest["priority"]>;
/** The query of `GET /jobs`. */
export type ListQuery = NonNullable<operations["listJobs"]["parameters"]["query"]>;

/** The statuses a job never leaves (`expired` follows `succeeded` once the result is gone). */
export const TERMINAL_STATUSES: readonly JobStatus[] = ["succeeded", "failed", "cancelled", "expired"];

/** Whether `status` is terminal. */
export function isTerminal(status: JobStatus | string): boolean {
  return (TERMINAL_STATUSES as readonly string[]).includes(status);
}

/**
 * A progress update, as `wait` reports it: the job's status and progress, from the live
 * stream's `progress` events or from `GET /jobs/{id}` (the same values either way).
 */
export interface ProgressUpdate {
  job_id: string;
  status: JobStatus;
  /** Percent complete, 0 to 100. */
  pct: number;
  stage: string | null;
  stage_index: number | null;
  stages_total: number | null;
  items_done: number | null;
  items_total: number | null;
  /** Estimated seconds to completion. */
  eta: number | null;
  /** How the shards of the job's fanned-out stage stand (null: it has not fanned out). */
  shards: ShardCounts | null;
  /** What `items_done` and `items_total` count (`items`, `bytes`…). */
  unit?: string;
}

/** The data of the live stream's `progress` event (the event's `id` is the progress sequence). */
export type StreamProgressEvent = ProgressUpdate;

/** The data of the live stream's last event, `status`: the job is terminal. */
export interface StreamStatusEvent {
  job_id: string;
  status: JobStatus;
  error?: { code: string; message: string };
  result_url?: string;
}
