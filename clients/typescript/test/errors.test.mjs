// Problem answers become LonghaulErrors; idempotent submissions; which calls are retried after
// a network error.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { test } from "node:test";

import { Longhaul, LonghaulError, LonghaulNetworkError } from "@longhaul/client";

import { API, client, demo, recordingFetch, token } from "./helpers.mjs";

/** Asserts `promise` rejects with a LonghaulError of `status` and `type`; answers it. */
async function problem(promise, status, type) {
  const err = await promise.then(
    (value) => assert.fail(`expected HTTP ${status}, got ${JSON.stringify(value)}`),
    (e) => e,
  );
  assert.ok(err instanceof LonghaulError, `a LonghaulError: ${err}`);
  assert.equal(err.status, status, err.message);
  assert.equal(err.type, type, err.message);
  assert.equal(err.problem.status, status);
  assert.equal(typeof err.title, "string");
  assert.ok(err.title.length > 0);
  assert.equal(typeof err.detail, "string");
  return err;
}

test("problem answers are LonghaulErrors with status, type, title and detail", async () => {
  const lh = client("errors");
  const unknown = await problem(
    lh.jobs.submit({ type: "no-such-type", params: {} }),
    422,
    "/problems/unknown-job-type",
  );
  assert.match(unknown.detail, /demo/, "names the accepted types");
  assert.equal(unknown.title, "Unknown job type");
  await problem(lh.jobs.submit({ type: "demo", params: { items: 0 } }), 422, "/problems/invalid-params");
  await problem(lh.jobs.submit(demo(1, 0, { priority: "urgent" })), 422, "/problems/invalid-priority");
  await problem(lh.jobs.get(randomUUID()), 404, "/problems/not-found");
  await problem(lh.jobs.list({ cursor: "not-a-cursor" }), 400, "/problems/bad-request");

  // A delayed job: pending for an hour, so it is cancelled before it runs.
  const job = await lh.jobs.submit(demo(1, 0, { delaySeconds: 3600 }));
  const early = await problem(lh.jobs.resultUrl(job.job_id), 409, "/problems/wrong-status");
  assert.equal(early.problem.status_now, "pending");
  const cancelled = await lh.jobs.cancel(job.job_id, { reason: "not needed" });
  assert.equal(cancelled.status, "cancelled");
  assert.equal(cancelled.cancellation.reason, "not needed");
  await problem(lh.jobs.cancel(job.job_id), 409, "/problems/wrong-status");
  const late = await problem(lh.jobs.resultUrl(job.job_id), 409, "/problems/wrong-status");
  assert.equal(late.problem.status_now, "cancelled");
  const view = await lh.jobs.get(job.job_id);
  assert.ok(view.not_before, "the delayed start is shown");
});

test("pause and resume: a pending job pauses at once, resumes to pending, and refusals are 409s", async () => {
  const lh = client("pause");
  const job = await lh.jobs.submit(demo(1, 0, { delaySeconds: 3600 }));
  const paused = await lh.jobs.pause(job.job_id, { reason: "month end" });
  assert.equal(paused.status, "paused");
  assert.equal(paused.pause.reason, "month end");
  assert.equal(typeof paused.pause.paused_at, "string");
  const view = await lh.jobs.get(job.job_id);
  assert.equal(view.status, "paused");
  assert.equal(typeof view.pause.lapses_at, "string", "when the pause lapses");
  const resumed = await lh.jobs.resume(job.job_id);
  assert.equal(resumed.status, "pending");
  const again = await problem(lh.jobs.resume(job.job_id), 409, "/problems/wrong-status");
  assert.equal(again.problem.status_now, "pending");
  await lh.jobs.cancel(job.job_id);
  await problem(lh.jobs.pause(job.job_id), 409, "/problems/wrong-status");
});

test("signal: a job waiting for one resumes; a second of the name is a 409", async () => {
  const lh = client("pause");
  const job = await lh.jobs.submit({
    type: "demo",
    params: { items: 2, wait_for: { signal: "approval", at_item: 1, timeout_seconds: 3600 } },
  });
  const deadline = Date.now() + 60_000;
  let view = await lh.jobs.get(job.job_id);
  while (view.status !== "paused") {
    assert.ok(Date.now() < deadline, `never parked: ${JSON.stringify(view)}`);
    await new Promise((r) => setTimeout(r, 50));
    view = await lh.jobs.get(job.job_id);
  }
  assert.equal(view.paused.reason, "waiting");
  assert.equal(view.paused.signal, "approval");
  const sent = await lh.jobs.signal(job.job_id, "approval", { ok: true });
  assert.equal(sent.status, "pending");
  await problem(lh.jobs.signal(job.job_id, "approval"), 409, "/problems/wrong-status");
  const done = await lh.jobs.wait(job.job_id);
  assert.equal(done.status, "succeeded");
});

test("the gateway's 401 is a LonghaulError too; a token function is asked again once", async () => {
  const bad = new Longhaul({ baseUrl: API, token: "not-a-jwt" });
  const err = await problem(bad.jobs.list(), 401, "about:blank");
  assert.equal(err.detail, "Unauthorized");

  const tokens = ["expired-token", token("errors")];
  const asked = [];
  const refreshing = new Longhaul({
    baseUrl: API,
    token: async () => {
      const t = tokens.shift() ?? token("errors");
      asked.push(t);
      return t;
    },
  });
  const page = await refreshing.jobs.list();
  assert.ok(Array.isArray(page.jobs));
  assert.equal(asked.length, 2, "asked once more after the 401");
  assert.equal(asked[0], "expired-token");
});

test("submit is idempotent: the same key answers the same job; a different request is refused", async () => {
  const lh = client("idempotency");
  const key = `order-${randomUUID()}`;
  const first = await lh.jobs.submit(demo(1, 0, { idempotencyKey: key }));
  assert.equal(first.replayed, false);
  assert.equal(first.idempotency_key, key);
  const second = await lh.jobs.submit(demo(1, 0, { idempotencyKey: key }));
  assert.equal(second.job_id, first.job_id);
  assert.equal(second.replayed, true);
  await problem(
    lh.jobs.submit(demo(2, 0, { idempotencyKey: key })),
    422,
    "/problems/idempotency-key-reused",
  );
  // Without a key, each submission gets its own: two jobs.
  const a = await lh.jobs.submit(demo(1, 0));
  const b = await lh.jobs.submit(demo(1, 0));
  assert.notEqual(a.job_id, b.job_id);
  assert.notEqual(a.idempotency_key, b.idempotency_key);
});

test("a submission whose answer was lost is sent again with its key: one job", async () => {
  let lost = 0;
  const rec = recordingFetch(async (entry, init) => {
    if (entry.method === "POST" && entry.url.endsWith("/jobs") && lost === 0) {
      lost += 1;
      await fetch(entry.url, init); // it reaches the API and the job is stored…
      throw new TypeError("fetch failed: the connection was reset"); // …but the answer is lost
    }
    return undefined;
  });
  const retried = [];
  const lh = client("network", { fetch: rec.fetch, onRetry: (i) => retried.push(i) });
  const job = await lh.jobs.submit(demo(1, 0));
  assert.equal(job.replayed, true, "the retry was answered with the stored job");
  const posts = rec.requests.filter((r) => r.method === "POST");
  assert.equal(posts.length, 2);
  assert.equal(posts[0].headers.get("idempotency-key"), posts[1].headers.get("idempotency-key"));
  assert.equal(retried.length, 1);
  assert.ok(retried[0].error instanceof TypeError);
  const page = await lh.jobs.list();
  assert.deepEqual(page.jobs.map((j) => j.job_id), [job.job_id], "exactly one job");
});

test("network errors are retried for idempotent calls only, a bounded number of times", async () => {
  const failing = recordingFetch(async () => {
    throw new TypeError("fetch failed: unreachable");
  });
  const lh = client("network", { fetch: failing.fetch, maxRetries: 2 });
  const get = await lh.jobs.get(randomUUID()).catch((e) => e);
  assert.ok(get instanceof LonghaulNetworkError, String(get));
  assert.equal(failing.requests.length, 3, "GET: the first try and two retries");

  failing.requests.length = 0;
  const upload = await lh.uploads
    .upload("a,b\n1,2\n", { filename: "x.csv", contentType: "text/csv" })
    .catch((e) => e);
  assert.ok(upload instanceof LonghaulNetworkError, String(upload));
  assert.equal(failing.requests.length, 1, "POST /uploads is not idempotent: not retried");
});

test("abort: a signal stops a call and its retries at once", async () => {
  const controller = new AbortController();
  const failing = recordingFetch(async () => {
    controller.abort();
    throw new TypeError("fetch failed");
  });
  const lh = client("network", { fetch: failing.fetch });
  const err = await lh.jobs.get(randomUUID(), { signal: controller.signal }).catch((e) => e);
  assert.equal(err.name, "AbortError");
  assert.equal(failing.requests.length, 1, "no retry after the abort");
});
