// 429: a real one, from the tenant's submission rate (LONGHAUL_TENANT_SUBMISSIONS_PER_MINUTE is
// low on the test stack, counted in fixed one-minute windows, Retry-After = seconds to the
// next minute). Each step first uses up the principal's window; a step that finds the window
// rolled over meanwhile (its submission accepted at once) simply goes again.
import assert from "node:assert/strict";
import { test } from "node:test";

import { LonghaulError } from "@longhaul/client";

import { SUBMISSIONS_PER_MINUTE, client, recordingFetch } from "./helpers.mjs";

/** Submissions that cost the stack nothing: they wait an hour before they start. */
const idle = () => ({ type: "demo", params: { items: 1, item_ms: 0 }, delaySeconds: 3600 });

/** Submits with a client that never retries until the rate limit refuses one; answers that error. */
async function exhaust(label) {
  const lh = client(label, { maxRetries: 0 });
  for (let i = 0; i <= 2 * SUBMISSIONS_PER_MINUTE + 1; i++) {
    const err = await lh.jobs.submit(idle()).then(() => undefined, (e) => e);
    if (err) return err;
  }
  assert.fail("the rate limit never refused a submission");
}

/** Runs `step` until it reports it saw the 429 it is about (at most a few windows). */
async function untilLimited(label, step) {
  for (let round = 0; round < 4; round++) {
    const refusal = await exhaust(label);
    assert.ok(refusal instanceof LonghaulError, String(refusal));
    assert.equal(refusal.status, 429);
    assert.equal(refusal.type, "/problems/rate-limited");
    assert.ok(refusal.retryAfter >= 0 && refusal.retryAfter <= 60, `Retry-After ${refusal.retryAfter}`);
    if (await step()) return;
  }
  assert.fail("never limited within four windows");
}

test("a 429 is waited out as its Retry-After says, then the submission goes through (one job)", async () => {
  await untilLimited("ratelimit", async () => {
    const rec = recordingFetch();
    const retries = [];
    const lh = client("ratelimit", { fetch: rec.fetch, onRetry: (i) => retries.push(i) });
    const job = await lh.jobs.submit(idle());
    const posts = rec.requests.filter((r) => r.method === "POST");
    if (posts[0].status !== 429) return false; // the window rolled over first
    assert.equal(job.status, "pending");
    assert.ok(posts.length >= 2);
    assert.equal(posts.at(-1).status, 202);
    assert.equal(new Set(posts.map((p) => p.headers.get("idempotency-key"))).size, 1, "one key");
    for (let i = 1; i < posts.length; i++) {
      const asked = Number(posts[i - 1].retryAfter) * 1000;
      const waited = posts[i].at - posts[i - 1].answeredAt;
      assert.ok(waited >= asked - 5, `waited ${waited} ms, Retry-After asked ${asked} ms`);
      assert.equal(retries[i - 1].delayMs, asked);
      assert.equal(retries[i - 1].error.status, 429);
    }
    return true;
  });
});

test("a Retry-After longer than the client may wait is thrown at once, with retryAfter", async () => {
  await untilLimited("ratelimit-cap", async () => {
    const lh = client("ratelimit-cap", { maxRetryDelayMs: 0 });
    const err = await lh.jobs.submit(idle()).then(() => undefined, (e) => e);
    if (!err) return false;
    assert.equal(err.status, 429);
    assert.equal(typeof err.retryAfter, "number");
    return true;
  });
});

test("aborting during a Retry-After wait rejects at once", async () => {
  await untilLimited("ratelimit-abort", async () => {
    const controller = new AbortController();
    let retried = false;
    const lh = client("ratelimit-abort", {
      onRetry: () => {
        retried = true;
        controller.abort();
      },
    });
    const started = performance.now();
    const outcome = await lh.jobs.submit({ ...idle(), signal: controller.signal }).then(
      () => undefined,
      (e) => e,
    );
    if (!retried) return false;
    assert.equal(outcome?.name, "AbortError", String(outcome));
    assert.ok(performance.now() - started < 10_000, "not after the Retry-After wait");
    return true;
  });
});
