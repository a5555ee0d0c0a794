// wait() when the stream fails: three failed attempts within 30 s switch it to polling
// GET /jobs/{id} at its Retry-After, and it tries the stream again later.
import assert from "node:assert/strict";
import { test } from "node:test";

import { client, demo, isStream, recordingFetch } from "./helpers.mjs";

test("three failed stream attempts fall back to polling at Retry-After, then the stream again", async () => {
  let failed = 0;
  const rec = recordingFetch(async (entry) => {
    if (isStream(entry.url) && failed < 3) {
      failed += 1;
      throw new TypeError("fetch failed: simulated stream outage");
    }
    return undefined;
  });
  const lh = client("fallback", { fetch: rec.fetch });
  // Long enough (150 items of 100 ms) to still run when the stream is tried again.
  const job = await lh.jobs.submit(demo(150, 100));
  const updates = [];
  const streamRetryMs = 5000;
  const done = await lh.jobs.wait(job.job_id, { onProgress: (u) => updates.push(u), streamRetryMs });
  assert.equal(done.status, "succeeded");
  assert.equal(updates.at(-1).pct, 100);

  const reads = rec.requests.filter((r) => r.method === "GET");
  const streams = reads.filter((r) => isStream(r.url));
  assert.equal(streams.slice(0, 3).filter((r) => r.error).length, 3, "three failed attempts");
  const third = streams[2];
  const again = streams[3];
  assert.ok(again, "the stream was tried again");
  assert.equal(again.status, 200, "and worked");
  assert.ok(
    again.at - third.answeredAt >= streamRetryMs,
    `tried again ${again.at - third.answeredAt} ms after the third failure`,
  );
  // Meanwhile: polls (how many depends on how fast the API answers), each at least the live
  // view's Retry-After (2 s) after the one before, the first 2 s after the third failure.
  const polls = reads.filter((r) => !isStream(r.url) && r.at > third.answeredAt && r.at < again.at);
  assert.ok(polls.length >= 1, "polled");
  assert.ok(polls.every((p) => p.retryAfter === "2"), "the live view asks for 2 s");
  let previous = third;
  for (const poll of polls) {
    const waited = poll.at - previous.answeredAt;
    assert.ok(waited >= 2000 - 5, `a poll ${waited} ms after the previous answer`);
    previous = poll;
  }
});

test("stream: false polls only", async () => {
  const rec = recordingFetch();
  const lh = client("fallback-poll", { fetch: rec.fetch });
  const job = await lh.jobs.submit(demo(10, 100));
  const done = await lh.jobs.wait(job.job_id, { stream: false });
  assert.equal(done.status, "succeeded");
  assert.equal(rec.requests.filter((r) => isStream(r.url)).length, 0);
  const polls = rec.requests.filter((r) => r.method === "GET");
  for (let i = 1; i < polls.length; i++) {
    assert.ok(polls[i].at - polls[i - 1].answeredAt >= 2000 - 5, "at the Retry-After pace");
  }
});

test("a stream that answers an error counts as a failure too", async () => {
  const rec = recordingFetch(async (entry) =>
    isStream(entry.url) ? new Response("upstream trouble", { status: 502 }) : undefined,
  );
  const lh = client("fallback-502", { fetch: rec.fetch });
  const job = await lh.jobs.submit(demo(60, 100));
  const done = await lh.jobs.wait(job.job_id, { streamRetryMs: 600_000 });
  assert.equal(done.status, "succeeded");
  const streams = rec.requests.filter((r) => isStream(r.url));
  assert.equal(streams.length, 3, "three attempts, then polling until the end (ten minutes away)");
});
