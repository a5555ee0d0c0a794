// The browser test's page (driven by tests/tests/typescript_client.rs in headless Chromium):
// submits a demo job, follows it with `wait` over the live stream, uploads a file (XHR, with
// progress) and reads the result's URL, recording what happened in `window.__state`. The page
// is served from another origin than the stream and the presigned URLs, so those are
// cross-origin as deployed. The API is reached through the test server (`/api`).
import { Longhaul } from "@longhaul/client";

const params = new URLSearchParams(location.hash.slice(1));
const token = params.get("token");
const baseUrl = `${location.origin}/api`;
const state = { phase: "starting", updates: [], requests: [], uploads: [] };
window.__state = state;
const log = (line) => {
  document.getElementById("log").textContent += `${line}\n`;
};

/** window.fetch, recording each request: url, Last-Event-ID, status or error. */
async function recording(input, init = {}) {
  const url = String(input);
  const entry = { url, lastEventId: new Headers(init.headers).get("last-event-id") };
  state.requests.push(entry);
  try {
    const response = await fetch(input, init);
    entry.status = response.status;
    return response;
  } catch (err) {
    entry.error = String(err);
    throw err;
  }
}

async function run() {
  const lh = new Longhaul({ baseUrl, token, fetch: recording });
  state.phase = "submitting";
  const job = await lh.jobs.submit({ type: "demo", params: { items: 80, item_ms: 100 } });
  state.jobId = job.job_id;
  state.phase = "waiting";
  const done = await lh.jobs.wait(job.job_id, {
    onProgress: (u) => {
      state.updates.push(u);
      document.getElementById("bar").value = u.pct;
      document.getElementById("status").textContent = `${u.status} ${u.pct}%`;
    },
  });
  state.final = { status: done.status, result_url: done.result_url ?? null };
  log(`job ${done.job_id} ${done.status}`);

  state.phase = "result";
  const url = await lh.jobs.resultUrl(job.job_id);
  state.resultUrl = url;
  const result = await (await fetch(url)).json();
  state.resultItems = result.items;

  state.phase = "upload";
  // Without an injected fetch, uploads go through XMLHttpRequest: the browser's upload progress.
  const plain = new Longhaul({ baseUrl, token });
  const csv = "region,amount\n" + Array.from({ length: 5000 }, (_, i) => `r${i % 3},${i}`).join("\n");
  state.input = await plain.uploads.upload(new Blob([csv], { type: "text/csv" }), {
    filename: "browser.csv",
    contentType: "text/csv",
    onProgress: (p) => state.uploads.push(p),
  });
  state.uploadSize = new Blob([csv]).size;

  state.phase = "problem";
  try {
    await plain.jobs.submit({ type: "no-such-type", params: {} });
  } catch (err) {
    state.problem = { name: err.name, status: err.status, type: err.type, title: err.title };
  }
  state.phase = "done";
}

run().catch((err) => {
  state.error = `${err?.name}: ${err?.message}\n${err?.stack ?? ""}`;
  state.phase = "failed";
  log(state.error);
});
