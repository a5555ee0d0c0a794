#!/usr/bin/env node
// Submit a demo job and follow it to its end with a live progress bar, then print its result.
//
// With `make dev` running (API on http://127.0.0.1:3000), from the repository root:
//
//   (cd clients/typescript && npm ci && npm run build)
//   LONGHAUL_TOKEN=$(make -s token SUB=alice | tail -1) node clients/typescript/examples/follow.mjs 50
//
// LONGHAUL_API names another API. Ctrl-C stops following (the job goes on; `--cancel-on-exit`
// cancels it too).
import { Longhaul, LonghaulError } from "@longhaul/client";

const baseUrl = process.env.LONGHAUL_API ?? "http://127.0.0.1:3000";
const token = process.env.LONGHAUL_TOKEN;
if (!token) {
  console.error("set LONGHAUL_TOKEN, e.g. LONGHAUL_TOKEN=$(make -s token SUB=alice | tail -1)");
  process.exit(2);
}
const items = Number(process.argv.find((a) => /^\d+$/.test(a)) ?? 50);
const cancelOnExit = process.argv.includes("--cancel-on-exit");

const lh = new Longhaul({
  baseUrl,
  token,
  onRetry: ({ request, delayMs, error }) =>
    console.error(`\n${request}: ${error.message ?? error}; retrying in ${Math.ceil(delayMs / 1000)} s`),
});

const controller = new AbortController();
let jobId;
process.once("SIGINT", async () => {
  controller.abort();
  if (cancelOnExit && jobId) await lh.jobs.cancel(jobId, { reason: "stopped from the example" });
});

function bar(update) {
  const width = 30;
  const filled = Math.round((update.pct / 100) * width);
  const items = update.items_total ? ` ${update.items_done}/${update.items_total} ${update.unit ?? "items"}` : "";
  const eta = update.eta != null ? ` eta ${update.eta}s` : "";
  process.stdout.write(
    `\r[${"#".repeat(filled)}${".".repeat(width - filled)}] ${update.pct.toFixed(0).padStart(3)}% ${update.status}${items}${eta}   `,
  );
}

try {
  const job = await lh.jobs.submit({ type: "demo", params: { items, item_ms: 100 } });
  jobId = job.job_id;
  console.log(`job ${job.job_id} ${job.status}`);
  const done = await lh.jobs.wait(job.job_id, { onProgress: bar, signal: controller.signal });
  process.stdout.write("\n");
  console.log(`job ${done.job_id} ${done.status}`);
  if (done.status === "succeeded") {
    const result = await (await lh.jobs.result(done.job_id)).json();
    console.log("result:", JSON.stringify(result));
  } else if (done.error) {
    console.log(`error: ${done.error.code}: ${done.error.message}`);
  }
  process.exit(done.status === "succeeded" ? 0 : 1);
} catch (err) {
  if (err?.name === "AbortError") {
    console.log(`\nstopped following job ${jobId}`);
    process.exit(130);
  }
  if (err instanceof LonghaulError) console.error(`\nerror: ${err.title} (HTTP ${err.status}): ${err.detail}`);
  else console.error(`\n${err}`);
  process.exit(4);
}
