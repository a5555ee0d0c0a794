// What the tests share: the stack's address and tokens (from the environment the Rust harness,
// tests/tests/typescript_client.rs, sets), clients, and a fetch that records every request.
import { createParser } from "eventsource-parser";
import { Longhaul } from "@longhaul/client";

function required(name) {
  const value = process.env[name];
  if (!value) {
    throw new Error(
      `${name} is not set: these tests run against a local stack, from ` +
        "`cargo test -p longhaul-tests --test typescript_client`",
    );
  }
  return value;
}

/** The API's base URL. */
export const API = required("LONGHAUL_API");

/** Submissions per minute and principal the stack allows (LONGHAUL_TENANT_SUBMISSIONS_PER_MINUTE). */
export const SUBMISSIONS_PER_MINUTE = Number(required("LONGHAUL_TEST_SUBMISSIONS_PER_MINUTE"));

/** A bearer token of the principal the harness made for `label` (one per test file or case). */
export function token(label) {
  const tokens = JSON.parse(required("LONGHAUL_TEST_TOKENS"));
  if (!tokens[label]) throw new Error(`no token for ${label}: add it to the harness's PRINCIPALS`);
  return tokens[label];
}

/** A client acting as the principal `label`. */
export function client(label, options = {}) {
  return new Longhaul({ baseUrl: API, token: token(label), ...options });
}

/** Whether `url` is the live stream (the events function's URL). */
export function isStream(url) {
  return String(url).includes("/events?token=");
}

/**
 * A fetch that records each request (`url`, `method`, `headers`, `at` when sent, `status` or
 * `error`, `answeredAt`) and the id of every stream event it passed on (`events`); `intercept`
 * may answer or throw instead of the network (return undefined to pass the request on).
 */
export function recordingFetch(intercept) {
  const requests = [];
  const events = [];
  const recorder = async (input, init = {}) => {
    const url = String(input instanceof Request ? input.url : input);
    const headers = new Headers(init.headers);
    const entry = { url, method: init.method ?? "GET", headers, at: performance.now() };
    requests.push(entry);
    try {
      let response = intercept ? await intercept(entry, init) : undefined;
      response ??= await fetch(input, init);
      entry.status = response.status;
      entry.answeredAt = performance.now();
      entry.retryAfter = response.headers.get("retry-after");
      if (isStream(url) && response.ok && response.body) {
        const [mine, theirs] = response.body.tee();
        const parser = createParser({
          onEvent: (e) => events.push({ id: e.id, event: e.event, data: e.data, url }),
        });
        (async () => {
          const reader = mine.pipeThrough(new TextDecoderStream()).getReader();
          try {
            for (;;) {
              const { done, value } = await reader.read();
              if (done) break;
              parser.feed(value);
            }
          } catch {
            // The client cancelled its branch: this one ends too.
          }
        })();
        return new Response(theirs, {
          status: response.status,
          statusText: response.statusText,
          headers: response.headers,
        });
      }
      return response;
    } catch (err) {
      entry.error = err;
      entry.answeredAt = performance.now();
      throw err;
    }
  };
  return { fetch: recorder, requests, events };
}

/** A `demo` job's submission body. */
export function demo(items, itemMs, extra = {}) {
  return { type: "demo", params: { items, item_ms: itemMs }, ...extra };
}
