import { LonghaulError } from "./errors.js";
import type { Transport } from "./http.js";
import type {
  Accepted,
  CancelAccepted,
  DeliveryList,
  Job,
  JobList,
  JobStatus,
  JobSummary,
  JobTypeList,
  PauseAccepted,
  Priority,
  SignalAccepted,
} from "./types.js";
import { randomUUID } from "./util.js";
import { type WaitOptions, waitForJob } from "./wait.js";

/** What `jobs.submit` sends. */
export interface SubmitOptions {
  /** The job type, e.g. `demo` (`GET /job-types` lists them). */
  type: string;
  /** The type's parameters. */
  params?: Record<string, unknown>;
  /**
   * The `Idempotency-Key`. One is generated when not given, and every retry of this submission
   * sends the same, so the client's own retries never make two jobs. Give your own (1–255
   * visible ASCII characters) to make a submission idempotent across page reloads or processes.
   */
  idempotencyKey?: string;
  /** An `https` URL the terminal event is POSTed to. */
  callbackUrl?: string;
  /** `high`, `normal` (the default) or `low`: the order among your waiting jobs. */
  priority?: Priority;
  /** Delayed start: not before this many seconds from now. Not with `notBefore`. */
  delaySeconds?: number;
  /** Delayed start: not before this time. Not with `delaySeconds`. */
  notBefore?: Date | string;
  signal?: AbortSignal;
}

/** A submission's answer: the API's body, and what the client knows about it. */
export type Submitted = Accepted & {
  /** The `Idempotency-Key` the submission was sent with. */
  idempotency_key: string;
  /** Whether the API answered with an existing job (`200`, `Idempotent-Replayed`). */
  replayed: boolean;
};

/** A retry's answer. */
export type Retried = Accepted & {
  /** Whether the job had already been retried: this is the job that retry made (`200`). */
  replayed: boolean;
};

/** `GET /jobs` filters and paging. */
export interface ListOptions {
  status?: JobStatus;
  type?: string;
  /** 1–100 (default 20). */
  limit?: number;
  /** `next_cursor` of the previous page. */
  cursor?: string;
  signal?: AbortSignal;
}

/** A call that takes nothing but a signal. */
export interface CallOptions {
  signal?: AbortSignal;
}

/** The job routes. */
export class Jobs {
  constructor(private readonly transport: Transport) {}

  private path(id: string, suffix = ""): string {
    return `/jobs/${encodeURIComponent(id)}${suffix}`;
  }

  /** `POST /jobs`: submits a job (`202`, or `200` for a replay of the same request). */
  async submit(options: SubmitOptions): Promise<Submitted> {
    const key = options.idempotencyKey ?? randomUUID();
    const body: Record<string, unknown> = { type: options.type, params: options.params ?? {} };
    if (options.callbackUrl !== undefined) body.callback_url = options.callbackUrl;
    if (options.priority !== undefined) body.priority = options.priority;
    if (options.delaySeconds !== undefined) body.delay_seconds = options.delaySeconds;
    if (options.notBefore !== undefined) {
      body.not_before =
        options.notBefore instanceof Date ? options.notBefore.toISOString() : options.notBefore;
    }
    const { body: accepted, response } = await this.transport.json<Accepted>({
      method: "POST",
      path: "/jobs",
      body,
      headers: { "Idempotency-Key": key },
      // The key makes it so: a retry is answered with the job the first try stored.
      idempotent: true,
      retryInFlight: true,
      signal: options.signal,
    });
    return {
      ...accepted,
      idempotency_key: key,
      replayed: response.headers.get("idempotent-replayed") === "true" || response.status === 200,
    };
  }

  /** `GET /jobs/{id}`: the job's status, progress and history. */
  async get(id: string, options: CallOptions = {}): Promise<Job> {
    const { body } = await this.transport.json<Job>({
      method: "GET",
      path: this.path(id),
      idempotent: true,
      signal: options.signal,
    });
    return body;
  }

  /** `GET /jobs`: one page of your jobs, newest first. */
  async list(options: ListOptions = {}): Promise<JobList> {
    const { body } = await this.transport.json<JobList>({
      method: "GET",
      path: "/jobs",
      query: {
        status: options.status,
        type: options.type,
        limit: options.limit,
        cursor: options.cursor,
      },
      idempotent: true,
      signal: options.signal,
    });
    return body;
  }

  /** Every job `list` would page through, following `next_cursor`. */
  async *iterate(options: Omit<ListOptions, "cursor"> = {}): AsyncGenerator<JobSummary> {
    let cursor: string | undefined;
    do {
      const page = await this.list({ ...options, cursor });
      yield* page.jobs;
      cursor = page.next_cursor ?? undefined;
    } while (cursor);
  }

  /**
   * `POST /jobs/{id}/cancel`: a `pending` or `queued` job is cancelled at once; a `running` one
   * is asked to stop (its stage honours it at its next progress write; follow it with `wait`).
   * A terminal job is a `409` `LonghaulError`. Asking again is harmless, so it is retried.
   */
  async cancel(id: string, options: { reason?: string; signal?: AbortSignal } = {}): Promise<CancelAccepted> {
    const { body } = await this.transport.json<CancelAccepted>({
      method: "POST",
      path: this.path(id, "/cancel"),
      body: options.reason === undefined ? {} : { reason: options.reason },
      idempotent: true,
      signal: options.signal,
    });
    return body;
  }

  /**
   * `POST /jobs/{id}/pause`: a `pending` or `queued` job is `paused` at once; a `running` one
   * is asked to pause (its stage saves its checkpoint at its next progress write and the job
   * becomes `paused`). Pausing again is harmless, so it is retried. A terminal job is a `409`.
   */
  async pause(id: string, options: { reason?: string; signal?: AbortSignal } = {}): Promise<PauseAccepted> {
    const { body } = await this.transport.json<PauseAccepted>({
      method: "POST",
      path: this.path(id, "/pause"),
      body: options.reason === undefined ? {} : { reason: options.reason },
      idempotent: true,
      signal: options.signal,
    });
    return body;
  }

  /**
   * `POST /jobs/{id}/resume`: a paused job is dispatched again (`pending`) and continues from
   * its checkpoint. A job that is not paused is a `409` `LonghaulError`, which a retry of a
   * resume that went through gets too — so a lost answer is not retried: read the job instead.
   */
  async resume(id: string, options: { signal?: AbortSignal } = {}): Promise<PauseAccepted> {
    const { body } = await this.transport.json<PauseAccepted>({
      method: "POST",
      path: this.path(id, "/resume"),
      body: {},
      idempotent: false,
      signal: options.signal,
    });
    return body;
  }

  /**
   * `POST /jobs/{id}/signals/{name}`: sends the job signal `name` with `payload` (any JSON, at
   * most 64 KB). A job waiting for it resumes at once (`pending`); one not waiting yet keeps
   * it for when its wait starts. A job receives each name once: a second is a `409`, so a
   * lost answer is not retried — read the job instead.
   */
  async signal(
    id: string,
    name: string,
    payload?: unknown,
    options: { signal?: AbortSignal } = {},
  ): Promise<SignalAccepted> {
    const { body } = await this.transport.json<SignalAccepted>({
      method: "POST",
      path: this.path(id, `/signals/${encodeURIComponent(name)}`),
      body: payload === undefined ? {} : { payload },
      idempotent: false,
      signal: options.signal,
    });
    return body;
  }

  /**
   * `POST /jobs/{id}/retry`: a `failed` or `cancelled` job runs again as a new job (`retry_of`
   * links them), from its last checkpoint unless `from: "start"`. Idempotent: retrying the same
   * job again answers with the job the first retry made.
   */
  async retry(
    id: string,
    options: { from?: "checkpoint" | "start"; signal?: AbortSignal } = {},
  ): Promise<Retried> {
    const { body, response } = await this.transport.json<Accepted>({
      method: "POST",
      path: this.path(id, "/retry"),
      body: options.from === undefined ? {} : { from: options.from },
      idempotent: true,
      signal: options.signal,
    });
    return { ...body, replayed: response.status === 200 };
  }

  /**
   * The result's link, absolute (valid 15 minutes, no token needed): `GET /jobs/{id}/result`
   * answers `303 See Other` to it once the job has succeeded — a presigned URL, or, for a
   * result of at most 1 KiB kept in the job's record, the API's own link (relative to the
   * request, resolved here). Before, a `409` `LonghaulError` (`status_now` in
   * its problem); once the result expired, `410`.
   *
   * Node (and any fetch that shows redirects) reads the `Location`. A browser's fetch hides
   * a redirect from scripts, so there the redirect is followed — the bearer token is not sent
   * to the other origin — and the URL it reached is answered, without reading the body.
   */
  async resultUrl(id: string, options: CallOptions = {}): Promise<string> {
    const path = this.path(id, "/result");
    const manual = await this.transport.send({
      method: "GET",
      path,
      redirect: "manual",
      success: (r) => r.status === 303 || r.type === "opaqueredirect",
      idempotent: true,
      signal: options.signal,
    });
    const location = manual.headers.get("location");
    if (manual.status === 303 && location) {
      await manual.body?.cancel().catch(() => undefined);
      return new URL(location, this.transport.url(path)).toString();
    }
    // A browser: the redirect is opaque. Follow it, and keep only where it led.
    const followed = await this.transport.send({
      method: "GET",
      path,
      success: (r) => r.redirected,
      idempotent: true,
      signal: options.signal,
    });
    await followed.body?.cancel().catch(() => undefined);
    if (!followed.ok) {
      throw new LonghaulError({
        type: "about:blank",
        title: "The result could not be read",
        status: followed.status,
        detail: `The result's URL answered HTTP ${followed.status}.`,
      });
    }
    return followed.url;
  }

  /** The result itself: a fetch of `resultUrl` (without the bearer token). */
  async result(id: string, options: CallOptions = {}): Promise<Response> {
    const url = await this.resultUrl(id, options);
    const response = await this.transport.options.fetch(url, { signal: options.signal });
    if (!response.ok) throw await LonghaulError.fromResponse(response);
    return response;
  }

  /**
   * Follows the job to its end — its live stream, or polling — and answers its terminal view
   * (`GET /jobs/{id}`): `succeeded`, `failed`, `cancelled` or `expired`. A job that failed is
   * answered, not thrown: look at `status` and `error`.
   */
  wait(id: string, options: WaitOptions = {}): Promise<Job> {
    return waitForJob(this.transport, id, options);
  }

  /** `GET /jobs/{id}/deliveries`: the job's webhook delivery attempts. */
  async deliveries(id: string, options: CallOptions = {}): Promise<DeliveryList> {
    const { body } = await this.transport.json<DeliveryList>({
      method: "GET",
      path: this.path(id, "/deliveries"),
      idempotent: true,
      signal: options.signal,
    });
    return body;
  }

  /** `GET /job-types`: the types this deployment accepts, their stages, params and policy. */
  async types(options: CallOptions = {}): Promise<JobTypeList> {
    const { body } = await this.transport.json<JobTypeList>({
      method: "GET",
      path: "/job-types",
      idempotent: true,
      signal: options.signal,
    });
    return body;
  }
}
