// The runnable example (examples/follow.mjs) does what its comment says.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { test } from "node:test";
import { promisify } from "node:util";

import { API, token } from "./helpers.mjs";

test("examples/follow.mjs follows a demo job to its result", async () => {
  const example = new URL("../examples/follow.mjs", import.meta.url);
  const { stdout } = await promisify(execFile)(process.execPath, [example.pathname, "20"], {
    env: { ...process.env, LONGHAUL_API: API, LONGHAUL_TOKEN: token("example") },
  });
  assert.match(stdout, /^job [0-9a-f-]{36} queued$/m);
  assert.match(stdout, /100% succeeded/);
  assert.match(stdout, /^job [0-9a-f-]{36} succeeded$/m);
  assert.match(stdout, /^result: \{"items":20,/m);
});
