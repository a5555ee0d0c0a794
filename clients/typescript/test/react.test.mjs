// The React hook (`@longhaul/client/react`), rendered with react-test-renderer: it follows a
// job to its end, re-rendering with status and progress, and reports errors.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { test } from "node:test";

import { createElement } from "react";
import TestRenderer from "react-test-renderer";

import { LonghaulError } from "@longhaul/client";
import { LonghaulProvider, useJob } from "@longhaul/client/react";

import { client, demo } from "./helpers.mjs";

globalThis.IS_REACT_ACT_ENVIRONMENT = false;
// react-test-renderer still works with React 19, and says at each render that it is deprecated.
const consoleError = console.error;
console.error = (...args) => {
  if (!String(args[0]).includes("react-test-renderer is deprecated")) consoleError(...args);
};

/** Renders `useJob(id)` under a provider; answers every state it rendered. */
function render(lh, id) {
  const seen = [];
  function Probe() {
    seen.push(useJob(id));
    return null;
  }
  const root = TestRenderer.create(createElement(LonghaulProvider, { client: lh }, createElement(Probe)));
  return { seen, root };
}

async function until(what, check) {
  const deadline = Date.now() + 120_000;
  while (!check()) {
    assert.ok(Date.now() < deadline, `never: ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

test("useJob follows a job to its end, re-rendering with its progress", async () => {
  const lh = client("react");
  const job = await lh.jobs.submit(demo(30, 100));
  const { seen, root } = render(lh, job.job_id);
  await until("the job's end", () => seen.at(-1)?.job !== undefined);
  root.unmount();
  const last = seen.at(-1);
  assert.equal(last.status, "succeeded");
  assert.equal(last.job.job_id, job.job_id);
  assert.equal(last.progress.pct, 100);
  assert.equal(last.error, undefined);
  assert.equal(seen[0].status, undefined, "nothing before the first read");
  assert.ok(seen.some((s) => s.status === "running" && s.progress.pct < 100), "progress while running");
});

test("useJob reports an error (an unknown job is a 404)", async () => {
  const { seen, root } = render(client("react"), randomUUID());
  await until("the error", () => seen.at(-1)?.error !== undefined);
  root.unmount();
  assert.ok(seen.at(-1).error instanceof LonghaulError);
  assert.equal(seen.at(-1).error.status, 404);
});
