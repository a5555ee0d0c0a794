// Abort a wait, cancel a running job, retry it (idempotently), and the uploads.
import assert from "node:assert/strict";
import { test } from "node:test";

import { client, demo, isStream, recordingFetch } from "./helpers.mjs";

test("a wait is aborted by its signal; a running job is cancelled, then retried as a new job", async () => {
  const rec = recordingFetch();
  const lh = client("manage", { fetch: rec.fetch });
  const job = await lh.jobs.submit(demo(1000, 100));

  // Abort the wait as soon as the job runs: it rejects at once and sends nothing more.
  const controller = new AbortController();
  const aborted = await lh.jobs
    .wait(job.job_id, {
      signal: controller.signal,
      onProgress: (u) => {
        if (u.status === "running" && u.items_done > 0) controller.abort();
      },
    })
    .then(() => undefined, (e) => e);
  assert.equal(aborted?.name, "AbortError", String(aborted));
  const sent = rec.requests.length;
  await new Promise((r) => setTimeout(r, 1500));
  assert.equal(rec.requests.length, sent, "nothing sent after the abort");

  const cancel = await lh.jobs.cancel(job.job_id, { reason: "enough" });
  assert.ok(["running", "cancelled"].includes(cancel.status), cancel.status);
  assert.equal(cancel.cancellation.reason, "enough");
  const ended = await lh.jobs.wait(job.job_id);
  assert.equal(ended.status, "cancelled");
  assert.equal(ended.cancellation.reason, "enough");

  const retry = await lh.jobs.retry(job.job_id, { from: "start" });
  assert.equal(retry.retry_of, job.job_id);
  assert.equal(retry.replayed, false);
  const again = await lh.jobs.retry(job.job_id);
  assert.equal(again.job_id, retry.job_id, "a retry of the same job answers the same new job");
  assert.equal(again.replayed, true);
  await lh.jobs.cancel(retry.job_id);
  const second = await lh.jobs.wait(retry.job_id);
  assert.equal(second.status, "cancelled");
  assert.equal(second.retry_of, job.job_id);
  assert.ok(rec.requests.some((r) => isStream(r.url) && r.status === 200));
});

test("an upload reports its progress and names an input a job reads", async () => {
  const lh = client("upload");
  const rows = ["region,amount"];
  for (let i = 0; i < 20000; i++) rows.push(`${["eu", "us", "apac"][i % 3]},${i % 7}`);
  const csv = rows.join("\n") + "\n";
  const seen = [];
  const input = await lh.uploads.upload(csv, {
    filename: "sales.csv",
    contentType: "text/csv",
    onProgress: (p) => seen.push(p),
  });
  assert.match(input, /^uploads\/.+\/sales\.csv$/);
  const total = new TextEncoder().encode(csv).byteLength;
  assert.deepEqual(seen[0], { loaded: 0, total });
  assert.deepEqual(seen.at(-1), { loaded: total, total });
  assert.ok(seen.length >= 3, `progress as the bytes went: ${JSON.stringify(seen)}`);
  for (let i = 1; i < seen.length; i++) assert.ok(seen[i].loaded >= seen[i - 1].loaded);

  const job = await lh.jobs.submit({
    type: "csv_report",
    params: { input, group_by: ["region"], metrics: [{ op: "sum", column: "amount" }] },
  });
  const done = await lh.jobs.wait(job.job_id);
  assert.equal(done.status, "succeeded", JSON.stringify(done.error));
  const report = await (await lh.jobs.result(job.job_id)).json();
  assert.equal(report.rows_scanned, 20000);
  assert.equal(report.rows.length, 3);

  // Binary data and Blobs go as they are.
  const bytes = new Uint8Array([0x61, 0x2c, 0x62, 0x0a, 0x31, 0x2c, 0x32, 0x0a]);
  assert.match(await lh.uploads.upload(bytes, { filename: "b.csv", contentType: "text/csv" }), /b\.csv$/);
  const blob = new Blob(["a,b\n"], { type: "text/csv" });
  assert.match(await lh.uploads.upload(blob, { filename: "c.csv", contentType: "text/csv" }), /c\.csv$/);
});
