// The happy path: submit a demo job, follow it over the live stream to its end with progress
// callbacks, read its result; get, list and iterate.
import assert from "node:assert/strict";
import { test } from "node:test";

import { client, demo, isStream, recordingFetch } from "./helpers.mjs";

// 8 s of items: longer than a link lives (3 s) plus two of its streams (2 s each, 1 s apart).
const ITEMS = 80;

test("a demo job is followed over the live stream to succeeded, with progress", async () => {
  const rec = recordingFetch();
  const lh = client("happy", { fetch: rec.fetch });
  const job = await lh.jobs.submit(demo(ITEMS, 100));
  assert.equal(job.status, "queued"); // started in the request: it took a free running slot
  assert.equal(job.replayed, false);
  assert.match(job.idempotency_key, /^[0-9a-f-]{36}$/);
  const submitted = rec.requests.find((r) => r.method === "POST");
  assert.equal(submitted.headers.get("idempotency-key"), job.idempotency_key);

  const updates = [];
  const done = await lh.jobs.wait(job.job_id, { onProgress: (u) => updates.push(u) });

  assert.equal(done.status, "succeeded", JSON.stringify(done));
  assert.equal(done.job_id, job.job_id);
  assert.ok(done.transitions.some((t) => t.state === "running"), "the terminal view, with its history");
  assert.equal(done.result_url, `/jobs/${job.job_id}/result`);
  // Progress: it moved while the job ran, never backwards, and ended full.
  assert.ok(
    updates.some((u) => u.status === "running" && u.pct > 0 && u.pct < 100),
    `progress while running: ${JSON.stringify(updates)}`,
  );
  for (let i = 1; i < updates.length; i++) {
    assert.ok(updates[i].pct >= updates[i - 1].pct, `backwards: ${JSON.stringify(updates)}`);
    assert.notDeepEqual(updates[i], updates[i - 1], "an update repeated");
  }
  const last = updates.at(-1);
  assert.equal(last.status, "succeeded");
  assert.equal(last.pct, 100);
  assert.equal(last.items_done, ITEMS);
  assert.equal(last.job_id, job.job_id);

  // It followed the stream: opened it, reconnected with Last-Event-ID after each stream's end,
  // and fetched a fresh link when one expired.
  const streams = rec.requests.filter((r) => isStream(r.url));
  assert.ok(streams.some((r) => r.status === 200), "a stream was opened");
  assert.ok(streams.every((r) => !r.headers.has("authorization")), "no bearer token to the stream");
  const resumed = streams.filter((r) => r.headers.has("last-event-id"));
  assert.ok(resumed.length >= 1, "reconnected with Last-Event-ID");
  // A link expired: the next request read the job for a fresh one, and the stream was opened
  // again with that one.
  const expired = rec.requests.filter((r) => isStream(r.url) && r.status === 401);
  assert.ok(expired.length >= 1, "a link expired");
  for (const r of expired) {
    const i = rec.requests.indexOf(r);
    const next = rec.requests[i + 1];
    assert.ok(next && !isStream(next.url) && next.method === "GET", "a fresh link was read");
    const reopened = rec.requests.slice(i + 1).find((n) => isStream(n.url));
    if (reopened) assert.notEqual(reopened.url, r.url, "with the fresh link");
  }
  // Never an event repeated across connections: ids grow, and each reconnect resumes after
  // the last progress event the client had.
  const ids = rec.events.filter((e) => e.event === "progress").map((e) => Number(e.id));
  assert.ok(ids.length >= 2, `progress events: ${ids}`);
  for (let i = 1; i < ids.length; i++) assert.ok(ids[i] > ids[i - 1], `ids ${ids}`);
  const seen = new Set(ids.map(String));
  for (const r of resumed) {
    assert.ok(seen.has(r.headers.get("last-event-id")), "resumed after an event it had");
  }
  // (No assertion that a `status` event arrived over the stream: wait() may end on the GET
  // that refreshes an expired link, when that view is already terminal.)

  // The result: the 303's link (the API's own, for a result this small), and the result itself.
  const url = await lh.jobs.resultUrl(job.job_id);
  assert.match(url, /^https?:\/\//);
  const viaUrl = await (await fetch(url)).json();
  assert.equal(viaUrl.items, ITEMS);
  const viaResult = await (await lh.jobs.result(job.job_id)).json();
  assert.deepEqual(viaResult, viaUrl);

  // get, list, iterate.
  const again = await lh.jobs.get(job.job_id);
  assert.equal(again.status, "succeeded");
  assert.equal(again.events_url, undefined, "a terminal job has no stream");
  const page = await lh.jobs.list({ status: "succeeded", type: "demo", limit: 1 });
  assert.equal(page.jobs[0].job_id, job.job_id);
  const none = await lh.jobs.list({ status: "failed" });
  assert.deepEqual(none.jobs, []);
  const all = [];
  for await (const summary of lh.jobs.iterate({ limit: 1 })) all.push(summary.job_id);
  assert.deepEqual(all, [job.job_id]);
  const types = await lh.jobs.types();
  assert.ok(types.job_types.some((t) => t.type === "demo"));
});

test("a job already terminal is answered at once, without a stream", async () => {
  const rec = recordingFetch();
  const lh = client("happy-terminal", { fetch: rec.fetch });
  const job = await lh.jobs.submit(demo(1, 0));
  const first = await lh.jobs.wait(job.job_id);
  assert.equal(first.status, "succeeded");
  const before = rec.requests.length;
  const updates = [];
  const again = await lh.jobs.wait(job.job_id, { onProgress: (u) => updates.push(u) });
  assert.deepEqual(again, first);
  assert.equal(rec.requests.length, before + 1, "one GET");
  assert.equal(updates.length, 1);
  assert.equal(updates[0].pct, 100);
});
