// longhaul web console: a plain ES module, no build step, no dependency.
//
// The token lives in sessionStorage only (gone with the tab); `#token=…` in the URL fills it
// and is stripped from the address at once. Live jobs are watched over their SSE stream
// (`events_url` from GET /jobs/{id}): EventSource resumes with Last-Event-ID by itself after
// a dropped connection; when the link expires (15 minutes) or the stream fails, the console
// fetches the job again for a fresh link and reopens it — a stream never dead-ends.

const TOKEN_KEY = "longhaul.token";
const API_KEY = "longhaul.api";
const LIVE = new Set(["pending", "queued", "running", "paused", "compensating"]);
const PAGE = 20;

const $ = (id) => document.getElementById(id);

/** An API error, from an application/problem+json body when there is one. */
class ApiError extends Error {
  constructor(status, title, detail, body) {
    super(`${title}${detail ? `: ${detail}` : ""}`);
    this.status = status;
    this.title = title;
    this.detail = detail;
    this.body = body;
  }
}

const state = {
  cursor: null,
  jobTypes: [],
  /** job id -> {row, job, watcher} */
  rows: new Map(),
  detailId: null,
  /** The next page of GET /schedules. */
  scheduleCursor: null,
  /** schedule id -> {row, schedule} */
  schedules: new Map(),
  scheduleDetailId: null,
  /** endpoint id -> {row, endpoint} */
  endpoints: new Map(),
  endpointDetailId: null,
  /** The next page of the open endpoint's deliveries. */
  deliveryCursor: null,
};

function apiBase() {
  return (localStorage.getItem(API_KEY) || location.origin).replace(/\/+$/, "");
}

function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

/** Calls the API; resolves to {status, headers, body} or throws an ApiError. */
async function api(method, path, body) {
  const headers = { Authorization: `Bearer ${token()}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(`${apiBase()}${path}`, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
    });
  } catch (err) {
    throw new ApiError(0, "The API could not be reached", String(err.message || err));
  }
  const text = await response.text();
  let json = null;
  try {
    json = text ? JSON.parse(text) : null;
  } catch {
    json = null;
  }
  if (!response.ok) throw toApiError(response.status, json, text);
  return { status: response.status, headers: response.headers, body: json };
}

function toApiError(status, json, text) {
  if (json && json.title) return new ApiError(status, json.title, json.detail || "", json);
  if (status === 401) {
    return new ApiError(401, "Unauthorized", "The token is missing, expired or not accepted by this API.", json);
  }
  const message = (json && json.message) || text || `HTTP ${status}`;
  return new ApiError(status, `HTTP ${status}`, message, json);
}

function showProblem(err) {
  const title = err instanceof ApiError ? err.title : "Something went wrong";
  const detail = err instanceof ApiError ? err.detail : String(err.message || err);
  $("problem-title").textContent = title;
  $("problem-detail").textContent = detail;
  $("problem").hidden = false;
}

function clearProblem() {
  $("problem").hidden = true;
}

/** Runs an action, showing its failure as a problem banner. */
async function attempt(action) {
  try {
    clearProblem();
    return await action();
  } catch (err) {
    showProblem(err);
    return undefined;
  }
}

// ------------------------------------------------------------------ sign in

function readTokenFromFragment() {
  const params = new URLSearchParams(location.hash.replace(/^#/, ""));
  const fromUrl = params.get("token");
  if (fromUrl) {
    sessionStorage.setItem(TOKEN_KEY, fromUrl);
    params.delete("token");
    const rest = params.toString();
    // Out of the address bar and the history entry: never bookmarked or shared by accident.
    history.replaceState(null, "", `${location.pathname}${location.search}${rest ? `#${rest}` : ""}`);
  }
}

function signedIn() {
  return token() !== "";
}

// ------------------------------------------------------------------ jobs list

function fmtTime(iso) {
  if (!iso) return "";
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? iso : date.toLocaleString();
}

function fmtEta(seconds) {
  if (seconds === null || seconds === undefined) return "";
  if (seconds < 60) return `${Math.round(seconds)} s left`;
  return `${Math.round(seconds / 60)} min left`;
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (value !== undefined && value !== null) node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child !== null && child !== undefined) node.append(child);
  }
  return node;
}

function rowFor(job) {
  let entry = state.rows.get(job.job_id);
  if (!entry) {
    const row = el("tr", { "data-job-id": job.job_id, "data-streams": "0", "data-streams-opened": "0", "data-link-refreshes": "0" });
    const bar = el("progress", { max: "100", value: "0" });
    const label = el("span", { class: "pct" }, "");
    const stage = el("span", { class: "stage" }, "");
    const shards = el("span", { class: "shards", hidden: "" });
    row.append(
      el("td", {}, el("a", { href: "#", class: "job-link", onclick: (e) => { e.preventDefault(); showDetail(job.job_id); } }, job.job_id)),
      el("td", { class: "type" }, job.type || ""),
      el("td", {}, el("span", { class: "status" }, "")),
      el("td", { class: "progress" }, bar, label, stage, shards),
      el("td", { class: "created" }, fmtTime(job.created_at)),
      el("td", { class: "actions" }),
    );
    entry = { row, job: {}, watcher: null, bar, label, stage, shards };
    state.rows.set(job.job_id, entry);
  }
  return entry;
}

/** Applies what is known of a job (a summary, a full job, or a stream event) to its row. */
function update(jobId, patch) {
  const entry = state.rows.get(jobId);
  if (!entry) return;
  const job = Object.assign(entry.job, patch);
  // What a paused job's view said holds only while it is paused.
  if (job.status !== "paused") delete job.paused;
  const row = entry.row;
  row.dataset.status = job.status || "";
  row.querySelector(".status").textContent = job.status || "";
  row.querySelector(".status").className = `status ${job.status || ""}`;
  const progress = job.progress || {};
  let pct = Number(progress.pct ?? 0);
  if (job.status === "succeeded" || job.status === "expired") pct = 100;
  // Progress never goes backwards (a reopened stream may start from an older view).
  pct = Math.max(pct, Number(entry.bar.value) || 0);
  entry.bar.value = pct;
  entry.label.textContent = `${Math.floor(pct)} %`;
  const items = progress.items_total ? ` · ${progress.items_done ?? 0}/${progress.items_total}` : "";
  const eta = LIVE.has(job.status) ? ` · ${fmtEta(progress.eta)}` : "";
  entry.stage.textContent = `${progress.stage || ""}${items}${eta}`.replace(/^ · /, "");
  renderShards(entry.shards, progress.shards);
  if (job.waiting) entry.stage.textContent = job.waiting.message || job.waiting.reason;
  if (job.retry_at) entry.stage.textContent = `retrying at ${fmtTime(job.retry_at)}`;
  renderActions(jobId);
}

/** How a fanned-out stage's shards stand, in words (`3/8 shards done, 2 running`). */
function shardsText(shards) {
  const parts = [`${shards.succeeded}/${shards.total} shards done`];
  if (shards.running) parts.push(`${shards.running} running`);
  if (shards.failed) parts.push(`${shards.failed} failed`);
  const retried = shards.attempts - shards.total;
  if (retried > 0) parts.push(`${retried} retried`);
  return parts.join(", ");
}

/**
 * A segmented bar of a fanned-out stage's shards: done, running, failed and pending, each as
 * wide as its share (hidden while the job has not fanned out). The counts are also its data
 * attributes and its title.
 */
function renderShards(node, shards) {
  node.hidden = !shards;
  if (!shards) return;
  const segments = ["succeeded", "running", "failed", "pending"].map((name) => {
    node.dataset[name] = String(shards[name]);
    const segment = el("span", { class: `segment ${name}` });
    // Through the CSSOM: the page's CSP allows no style attribute.
    segment.style.width = `${shards.total ? (100 * shards[name]) / shards.total : 0}%`;
    return segment;
  });
  node.dataset.total = String(shards.total);
  node.dataset.attempts = String(shards.attempts);
  node.title = shardsText(shards);
  node.replaceChildren(...segments);
}

function renderActions(jobId) {
  const entry = state.rows.get(jobId);
  const job = entry.job;
  const cell = entry.row.querySelector(".actions");
  cell.replaceChildren();
  if (job.paused && job.paused.signal) {
    cell.append(el("button", { type: "button", class: "signal", onclick: () => signal(jobId, job.paused.signal) }, `Signal ${job.paused.signal}`));
  } else if (job.status === "paused" || (job.status === "running" && job.pause)) {
    cell.append(el("button", { type: "button", class: "resume", onclick: () => control(jobId, "resume") }, "Resume"));
  } else if (LIVE.has(job.status) && job.status !== "compensating") {
    cell.append(el("button", { type: "button", class: "pause", onclick: () => control(jobId, "pause") }, "Pause"));
  }
  // A compensating job is ending already (its undos run): nothing to control.
  if (LIVE.has(job.status) && job.status !== "compensating") {
    cell.append(el("button", { type: "button", class: "cancel", onclick: () => cancel(jobId) }, "Cancel"));
  }
  if (job.status === "failed" || job.status === "cancelled") {
    cell.append(el("button", { type: "button", class: "retry", onclick: () => retry(jobId) }, "Retry"));
  }
  if (job.status === "succeeded") {
    cell.append(el("button", { type: "button", class: "download", onclick: () => download(jobId) }, "Download"));
  }
}

async function loadJobs(reset) {
  if (reset) {
    for (const entry of state.rows.values()) stopWatching(entry);
    state.rows.clear();
    state.cursor = null;
    $("jobs").tBodies[0].replaceChildren();
    $("more").hidden = true;
  }
  if (!signedIn()) return;
  const query = new URLSearchParams({ limit: String(PAGE) });
  if ($("filter-status").value) query.set("status", $("filter-status").value);
  if ($("filter-type").value) query.set("type", $("filter-type").value);
  if (!reset && state.cursor) query.set("cursor", state.cursor);
  await attempt(async () => {
    const { body } = await api("GET", `/jobs?${query}`);
    for (const job of body.jobs) addJob(job, false);
    state.cursor = body.next_cursor || null;
    $("more").hidden = !state.cursor;
    $("empty").hidden = state.rows.size > 0;
  });
}

/** Shows a job (at the top when new) and watches it while it is live. */
function addJob(job, top) {
  const known = state.rows.has(job.job_id);
  const entry = rowFor(job);
  const body = $("jobs").tBodies[0];
  if (!known) {
    if (top) body.prepend(entry.row);
    else body.append(entry.row);
  }
  update(job.job_id, job);
  $("empty").hidden = true;
  if (LIVE.has(job.status)) watch(job.job_id);
}

// ------------------------------------------------------------------ live progress

function stopWatching(entry) {
  if (entry && entry.watcher) {
    entry.watcher.stopped = true;
    if (entry.watcher.source) entry.watcher.source.close();
    clearTimeout(entry.watcher.timer);
    entry.watcher = null;
  }
}

/** Follows a live job over its SSE stream until it ends. */
function watch(jobId) {
  const entry = state.rows.get(jobId);
  if (!entry || entry.watcher) return;
  const watcher = { source: null, timer: null, failures: 0, stopped: false };
  entry.watcher = watcher;
  refreshAndOpen(jobId, watcher);
}

/** Fetches the job (its current state and a fresh events_url) and opens the stream. */
async function refreshAndOpen(jobId, watcher) {
  if (watcher.stopped) return;
  let job;
  try {
    job = (await api("GET", `/jobs/${encodeURIComponent(jobId)}`)).body;
  } catch (err) {
    if (err instanceof ApiError && err.status === 404) {
      stopWatching(state.rows.get(jobId)); // the job no longer exists
      return;
    }
    // Not a dead end: try again, backing off (the API or the network may be down).
    retryLater(jobId, watcher);
    return;
  }
  update(jobId, job);
  if (!LIVE.has(job.status) || !job.events_url) {
    finish(jobId);
    return;
  }
  open(jobId, watcher, job.events_url);
}

function retryLater(jobId, watcher) {
  if (watcher.stopped) return;
  watcher.failures += 1;
  const delay = Math.min(30000, 1000 * 2 ** Math.min(watcher.failures - 1, 5));
  clearTimeout(watcher.timer);
  watcher.timer = setTimeout(() => refreshAndOpen(jobId, watcher), delay);
}

function open(jobId, watcher, url) {
  const entry = state.rows.get(jobId);
  if (!entry || watcher.stopped) return;
  const source = new EventSource(url);
  watcher.source = source;
  entry.row.dataset.streams = String(Number(entry.row.dataset.streams) + 1);
  source.addEventListener("open", () => {
    watcher.failures = 0;
    entry.row.dataset.streamsOpened = String(Number(entry.row.dataset.streamsOpened) + 1);
    entry.row.dataset.streamOpen = "true";
  });
  source.addEventListener("progress", (event) => {
    const data = JSON.parse(event.data);
    const was = state.rows.get(jobId)?.job.status;
    update(jobId, {
      status: data.status,
      progress: {
        pct: data.pct, stage: data.stage, items_done: data.items_done,
        items_total: data.items_total, eta: data.eta, shards: data.shards,
      },
    });
    // Paused (by its owner, or waiting for a signal): the job's view says why, and offers
    // what to do (resume, or send the signal).
    if (data.status === "paused" && was !== "paused") {
      attempt(async () => {
        const { body } = await api("GET", `/jobs/${encodeURIComponent(jobId)}`);
        update(jobId, body);
      });
    }
  });
  source.addEventListener("status", (event) => {
    // The terminal event: the stream is over (closing stops EventSource reconnecting).
    source.close();
    const data = JSON.parse(event.data);
    update(jobId, { status: data.status, error: data.error });
    finish(jobId);
  });
  source.addEventListener("error", (event) => {
    entry.row.dataset.streamOpen = "false";
    if (event.data) {
      // The server's own `error` event (the job is gone): nothing more will come.
      source.close();
      retryLater(jobId, watcher);
      return;
    }
    if (source.readyState === EventSource.CONNECTING) {
      // A dropped connection or a stream that ended at its time limit: EventSource
      // reconnects by itself with Last-Event-ID.
      return;
    }
    // CLOSED: refused (an expired link is a 401, a busy job a 429) — get a fresh link.
    source.close();
    entry.row.dataset.linkRefreshes = String(Number(entry.row.dataset.linkRefreshes) + 1);
    if (watcher.failures === 0) {
      watcher.failures = 1;
      refreshAndOpen(jobId, watcher);
    } else {
      retryLater(jobId, watcher);
    }
  });
}

/** A job ended: read it once more (the final transitions, error, result) and stop. */
async function finish(jobId) {
  const entry = state.rows.get(jobId);
  stopWatching(entry);
  await attempt(async () => {
    const { body } = await api("GET", `/jobs/${encodeURIComponent(jobId)}`);
    update(jobId, body);
    if (state.detailId === jobId) renderDetail(body);
  });
}

// ------------------------------------------------------------------ actions

async function cancel(jobId) {
  await attempt(async () => {
    await api("POST", `/jobs/${encodeURIComponent(jobId)}/cancel`, { reason: "cancelled from the web console" });
    const entry = state.rows.get(jobId);
    stopWatching(entry);
    const { body } = await api("GET", `/jobs/${encodeURIComponent(jobId)}`);
    update(jobId, body);
    // A running job ends at its next progress write: keep following it until it does.
    if (LIVE.has(body.status)) watch(jobId);
  });
}

/** Pauses (a running job at its next progress write) or resumes a job, then follows it. */
async function control(jobId, action) {
  await attempt(async () => {
    const body = action === "pause" ? { reason: "paused from the web console" } : {};
    await api("POST", `/jobs/${encodeURIComponent(jobId)}/${action}`, body);
    const entry = state.rows.get(jobId);
    stopWatching(entry);
    const { body: job } = await api("GET", `/jobs/${encodeURIComponent(jobId)}`);
    update(jobId, job);
    if (state.detailId === jobId) renderDetail(job);
    if (LIVE.has(job.status)) watch(jobId);
  });
}

/** Sends the signal a waiting job waits for, with a payload typed as JSON (empty: none). */
async function signal(jobId, name) {
  const text = window.prompt(`Payload of signal ${name} (JSON; empty for none)`, "");
  if (text === null) return;
  await attempt(async () => {
    const body = text.trim() === "" ? {} : { payload: JSON.parse(text) };
    await api("POST", `/jobs/${encodeURIComponent(jobId)}/signals/${encodeURIComponent(name)}`, body);
    const entry = state.rows.get(jobId);
    stopWatching(entry);
    const { body: job } = await api("GET", `/jobs/${encodeURIComponent(jobId)}`);
    update(jobId, job);
    if (state.detailId === jobId) renderDetail(job);
    if (LIVE.has(job.status)) watch(jobId);
  });
}

async function retry(jobId) {
  await attempt(async () => {
    const { body } = await api("POST", `/jobs/${encodeURIComponent(jobId)}/retry`);
    const { body: job } = await api("GET", `/jobs/${encodeURIComponent(body.job_id)}`);
    addJob(job, true);
  });
}

/** Downloads the result: GET /jobs/{id}/result answers 303 to a presigned URL, followed here. */
async function download(jobId) {
  await attempt(async () => {
    let response;
    try {
      response = await fetch(`${apiBase()}/jobs/${encodeURIComponent(jobId)}/result`, {
        headers: { Authorization: `Bearer ${token()}` },
        cache: "no-store",
      });
    } catch (err) {
      throw new ApiError(0, "The result could not be downloaded", String(err.message || err));
    }
    if (!response.ok) {
      const text = await response.text();
      let json = null;
      try { json = JSON.parse(text); } catch { json = null; }
      throw toApiError(response.status, json, text);
    }
    const blob = await response.blob();
    const type = response.headers.get("content-type") || "";
    const ext = type.includes("csv") ? "csv" : type.includes("json") ? "json" : "bin";
    const link = el("a", { href: URL.createObjectURL(blob), download: `${jobId}-result.${ext}` });
    document.body.append(link);
    link.click();
    link.remove();
    const row = state.rows.get(jobId);
    if (row) row.row.dataset.downloadedBytes = String(blob.size);
    setTimeout(() => URL.revokeObjectURL(link.href), 60000);
  });
}

// ------------------------------------------------------------------ detail

async function showDetail(jobId) {
  state.detailId = jobId;
  await attempt(async () => {
    const [{ body: job }, { body: deliveries }] = await Promise.all([
      api("GET", `/jobs/${encodeURIComponent(jobId)}`),
      api("GET", `/jobs/${encodeURIComponent(jobId)}/deliveries`),
    ]);
    renderDetail(job);
    renderDeliveries(deliveries.deliveries || []);
    $("detail-section").hidden = false;
    $("detail-section").scrollIntoView({ block: "nearest" });
  });
}

/** Empties the description list `dl`; returns what adds one `name: value` pair to it (none
 * for an empty value). */
function summaryList(dl) {
  dl.replaceChildren();
  return (name, value) => {
    if (value === undefined || value === null || value === "") return;
    dl.append(el("dt", {}, name), el("dd", {}, String(value)));
  };
}

function renderDetail(job) {
  $("detail-id").textContent = job.job_id;
  const add = summaryList($("detail-summary"));
  add("Type", job.type);
  add("Status", job.status);
  add("Priority", job.priority);
  add("Attempt", job.attempt);
  add("Progress", job.progress ? `${Math.floor(job.progress.pct ?? 0)} % ${job.progress.stage || ""}` : "");
  if (job.progress?.shards) add("Shards", shardsText(job.progress.shards));
  add("Created", fmtTime(job.created_at));
  add("Started", fmtTime(job.started_at));
  add("Finished", fmtTime(job.finished_at));
  add("Not before", fmtTime(job.not_before));
  add("Retry of", job.retry_of);
  if (job.schedule_id) add("Schedule", `${job.schedule_id} (tick ${fmtTime(job.scheduled_at)})`);
  add("Callback", job.callback_url);
  if (job.waiting) add("Waiting", job.waiting.message || job.waiting.reason);
  if (job.retry_at) add("Next attempt", fmtTime(job.retry_at));
  if (job.last_error) add("Last error", `${job.last_error.code}: ${job.last_error.message}`);
  if (job.error) add("Error", `${job.error.code}: ${job.error.message}`);
  if (job.cancellation) add("Cancellation", JSON.stringify(job.cancellation));
  if (job.compensation) {
    const steps = (job.compensation.stages || [])
      .map((s) => `${s.stage}: ${s.status}${s.error ? ` (${s.error})` : ""}`)
      .join("; ");
    add("Compensation", `${job.compensation.status}, then ${job.compensation.ends_as}${steps ? ` — ${steps}` : " — nothing to undo"}`);
  }
  if (job.paused && job.paused.signal) {
    add("Waiting", `for signal ${job.paused.signal} until ${fmtTime(job.paused.until)} (link: ${job.paused.signal_url || "-"})`);
  } else if (job.pause) {
    const who = `by ${job.pause.requested_by}${job.pause.reason ? `: ${job.pause.reason}` : ""}`;
    add("Pause", job.pause.paused_at
      ? `paused since ${fmtTime(job.pause.paused_at)} ${who} (cancelled at ${fmtTime(job.pause.lapses_at)} unless resumed)`
      : `asked ${fmtTime(job.pause.requested_at)} ${who}; the stage pauses at its next progress write`);
  }
  const body = $("transitions").tBodies[0];
  body.replaceChildren(
    ...(job.transitions || []).map((t) => el("tr", {}, el("td", {}, t.state), el("td", {}, fmtTime(t.at)), el("td", {}, t.reason || ""))),
  );
  $("detail-raw").textContent = JSON.stringify(job, null, 2);
}

function renderDeliveries(deliveries) {
  const body = $("deliveries").tBodies[0];
  body.replaceChildren(
    ...deliveries.map((d) => el(
      "tr", {},
      el("td", {}, d.event || ""), el("td", {}, String(d.attempt ?? "")), el("td", {}, fmtTime(d.at)),
      el("td", {}, d.status_code == null ? "" : String(d.status_code)),
      el("td", {}, d.latency_ms == null ? "" : `${d.latency_ms} ms`),
      el("td", {}, d.outcome || ""), el("td", {}, d.error || ""),
    )),
  );
  $("no-deliveries").hidden = deliveries.length > 0;
}

// ------------------------------------------------------------------ submit form

/** Resolves a local `$ref` (`#/$defs/…`) against the schema it came from. */
function deref(schema, root) {
  let node = schema;
  for (let i = 0; node && node.$ref && i < 10; i += 1) {
    const path = node.$ref.replace(/^#\//, "").split("/");
    node = path.reduce((n, key) => (n ? n[key] : undefined), root);
  }
  return node || {};
}

/** The enum values a (sub)schema allows, if it is an enumeration. */
function enumValues(schema, root) {
  const node = deref(schema, root);
  if (Array.isArray(node.enum)) return node.enum;
  if (node.const !== undefined) return [node.const];
  const alternatives = node.oneOf || node.anyOf;
  if (Array.isArray(alternatives)) {
    const values = [];
    for (const alt of alternatives) {
      const inner = deref(alt, root);
      if (inner.type === "null") continue;
      const found = enumValues(inner, root);
      if (!found) return null;
      values.push(...found);
    }
    return values.length ? values : null;
  }
  return null;
}

function baseType(schema, root) {
  const node = deref(schema, root);
  if (Array.isArray(node.type)) return node.type.find((t) => t !== "null") || "string";
  if (node.type) return node.type;
  const alternatives = node.oneOf || node.anyOf;
  if (Array.isArray(alternatives)) {
    const inner = alternatives.map((a) => deref(a, root)).find((a) => a.type !== "null");
    if (inner) return baseType(inner, root);
  }
  return "json";
}

/** Whether a param names an upload (a file input is offered beside it). */
function namesUpload(name, schema) {
  return /^inputs?$/.test(name) || /upload/i.test(schema.description || "");
}

function renderParams() {
  const container = $("params-fields");
  container.replaceChildren();
  const kind = state.jobTypes.find((t) => t.type === $("job-type").value);
  if (!kind) return;
  const root = kind.params_schema || {};
  const schema = deref(root, root);
  const required = new Set(schema.required || []);
  for (const [name, raw] of Object.entries(schema.properties || {})) {
    const prop = deref(raw, root);
    const values = enumValues(raw, root);
    const type = values ? "enum" : baseType(raw, root);
    const id = `param-${name}`;
    let input;
    if (type === "enum") {
      input = el("select", { id });
      if (!required.has(name)) input.append(el("option", { value: "" }, "(default)"));
      for (const value of values) input.append(el("option", { value: JSON.stringify(value) }, String(value)));
    } else if (type === "boolean") {
      input = el("select", { id }, el("option", { value: "" }, "(default)"), el("option", { value: "true" }, "true"), el("option", { value: "false" }, "false"));
    } else if (type === "integer" || type === "number") {
      input = el("input", { id, type: "number", step: type === "integer" ? "1" : "any", min: prop.minimum, max: prop.maximum });
    } else if (type === "string") {
      input = el("input", { id, type: "text", spellcheck: "false" });
    } else {
      input = el("textarea", { id, rows: "3", spellcheck: "false", placeholder: "JSON" });
    }
    input.dataset.param = name;
    input.dataset.kind = type;
    if (prop.default !== undefined && type !== "enum") {
      input.placeholder = `default ${JSON.stringify(prop.default)}`;
    }
    if (required.has(name)) input.required = true;
    const label = el("label", { class: "param", title: prop.description || "" },
      el("span", {}, `${name}${required.has(name) ? " *" : ""}`), input);
    if (prop.description) label.append(el("small", {}, prop.description));
    if (type === "string" && namesUpload(name, prop)) {
      const file = el("input", { type: "file", "data-upload-for": name });
      file.addEventListener("change", () => upload(file, input));
      label.append(file);
    }
    container.append(label);
  }
  $("raw-params").value = JSON.stringify(formParams(false), null, 2);
}

/** The params the form's fields say (only the filled ones; the server applies defaults). */
function formParams(strict) {
  const params = {};
  for (const input of $("params-fields").querySelectorAll("[data-param]")) {
    const value = input.value.trim();
    if (value === "") continue;
    const name = input.dataset.param;
    switch (input.dataset.kind) {
      case "integer":
      case "number":
        params[name] = Number(value);
        break;
      case "boolean":
        params[name] = value === "true";
        break;
      case "enum":
        params[name] = JSON.parse(value);
        break;
      case "string":
        params[name] = input.value;
        break;
      default:
        try {
          params[name] = JSON.parse(value);
        } catch {
          if (strict) throw new ApiError(0, "Invalid params", `${name} is not valid JSON.`);
        }
    }
  }
  return params;
}

/** Uploads a file (POST /uploads, then the presigned PUT) and names it in the param. */
async function upload(fileInput, target) {
  const file = fileInput.files[0];
  if (!file) return;
  await attempt(async () => {
    target.value = "";
    target.placeholder = `uploading ${file.name}…`;
    const { body: grant } = await api("POST", "/uploads", {
      filename: file.name,
      content_type: file.type || "application/octet-stream",
      size_bytes: file.size,
    });
    let response;
    try {
      response = await fetch(grant.upload_url, { method: grant.method || "PUT", headers: grant.headers || {}, body: file });
    } catch (err) {
      throw new ApiError(0, "The upload failed", String(err.message || err));
    }
    if (!response.ok) throw new ApiError(response.status, "The upload failed", `storage answered ${response.status}`);
    target.value = grant.input;
    target.placeholder = "";
  });
}

async function submit(event) {
  event.preventDefault();
  await attempt(async () => {
    let params;
    if ($("raw-mode").checked) {
      try {
        params = JSON.parse($("raw-params").value || "{}");
      } catch (err) {
        throw new ApiError(0, "Invalid params", `The JSON does not parse: ${err.message}`);
      }
    } else {
      params = formParams(true);
    }
    const request = { type: $("job-type").value, params, priority: $("priority").value };
    if ($("callback-url").value.trim()) request.callback_url = $("callback-url").value.trim();
    if ($("schedule-mode").checked) {
      await createSchedule(request);
      return;
    }
    const { body } = await api("POST", "/jobs", request);
    const { body: job } = await api("GET", `/jobs/${encodeURIComponent(body.job_id)}`);
    addJob(job, true);
  });
}

async function loadJobTypes() {
  if (!signedIn()) return;
  await attempt(async () => {
    const { body } = await api("GET", "/job-types");
    state.jobTypes = body.job_types || [];
    const select = $("job-type");
    const filter = $("filter-type");
    const current = select.value;
    select.replaceChildren(...state.jobTypes.map((t) => el("option", { value: t.type }, t.type)));
    filter.replaceChildren(el("option", { value: "" }, "any"), ...state.jobTypes.map((t) => el("option", { value: t.type }, t.type)));
    if (state.jobTypes.some((t) => t.type === current)) select.value = current;
    renderParams();
  });
}

// ------------------------------------------------------------------ schedules

/** A `datetime-local` value (the browser's zone) as RFC 3339 in UTC, or undefined. */
function isoFromLocal(value) {
  if (!value) return undefined;
  const date = new Date(value);
  if (Number.isNaN(date.getTime())) throw new ApiError(0, "Invalid time", `${value} is not a time.`);
  return date.toISOString();
}

/** The form's job spec (type, params, priority, callback) plus its schedule fields. */
async function createSchedule(job) {
  const request = { ...job, schedule: $("schedule-expression").value.trim(), overlap: $("schedule-overlap").value };
  const timezone = $("schedule-timezone").value.trim();
  if (timezone) request.timezone = timezone;
  const startAt = isoFromLocal($("schedule-start").value);
  if (startAt) request.start_at = startAt;
  const endAt = isoFromLocal($("schedule-end").value);
  if (endAt) request.end_at = endAt;
  if ($("schedule-paused").checked) request.paused = true;
  if ($("schedule-pause-on-failure").checked) request.pause_on_failure = true;
  const { body } = await api("POST", "/schedules", request);
  addSchedule(body);
  $("schedules-empty").hidden = true;
  state.schedules.get(body.schedule_id).row.scrollIntoView({ block: "nearest" });
}

/** Switches the form between a job submitted once and a schedule. */
function setScheduleMode(on) {
  $("schedule-fields").hidden = !on;
  // A disabled fieldset's (required) fields are left out of the form's validation.
  $("schedule-fields").disabled = !on;
  $("submit").textContent = on ? "Create schedule" : "Submit";
  $("submit-title").textContent = on ? "New schedule" : "New job";
}

function fillTimeZones() {
  const zones = typeof Intl.supportedValuesOf === "function" ? Intl.supportedValuesOf("timeZone") : [];
  $("timezones").replaceChildren(...["UTC", ...zones].map((zone) => el("option", { value: zone })));
  // Ticks are read in the user's own zone unless they say otherwise.
  $("schedule-timezone").value = Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC";
}

function countsText(counts) {
  const c = counts || {};
  return `${c.fired ?? 0} fired · ${c.submitted ?? 0} submitted · ${c.skipped ?? 0} skipped · ${c.refused ?? 0} refused`;
}

function jobLink(jobId, text) {
  return el("a", { href: "#", class: "job-link", onclick: (e) => { e.preventDefault(); showDetail(jobId); } }, text || jobId);
}

/** What a schedule's last tick came to, as nodes: outcome, tick time, its job or why not. */
function lastFireNodes(fire) {
  if (!fire) return ["never fired"];
  const nodes = [el("span", { class: `status ${fire.outcome}` }, fire.outcome), ` ${fmtTime(fire.scheduled_at)}`];
  if (fire.job_id) nodes.push(" · ", jobLink(fire.job_id, fire.job_id.slice(0, 8)));
  if (fire.reason) nodes.push(el("span", { class: "reason" }, fire.reason));
  return nodes;
}

function nextFireText(schedule) {
  if (schedule.next_fire_at) return fmtTime(schedule.next_fire_at);
  return schedule.state === "paused" ? "— (paused)" : "— (none left in its window)";
}

/** The entry of `id` in a list kept in `entries` (a Map) and shown in the table `tableId`,
 * its row marked with the data attribute `attribute`: a new one is added at the end (the
 * lists are oldest first). */
function listEntry(entries, tableId, attribute, id) {
  let entry = entries.get(id);
  if (!entry) {
    entry = { row: el("tr", { [attribute]: id }) };
    entries.set(id, entry);
    $(tableId).tBodies[0].append(entry.row);
  }
  return entry;
}

/** Shows a schedule in the list. */
function addSchedule(schedule) {
  listEntry(state.schedules, "schedules", "data-schedule-id", schedule.schedule_id);
  renderSchedule(schedule);
}

function renderSchedule(schedule) {
  const entry = state.schedules.get(schedule.schedule_id);
  if (!entry) return;
  entry.schedule = schedule;
  const id = schedule.schedule_id;
  const row = entry.row;
  row.dataset.state = schedule.state;
  row.dataset.nextFireAt = schedule.next_fire_at || "";
  row.dataset.lastOutcome = schedule.last_fire ? schedule.last_fire.outcome : "";
  row.dataset.lastJobId = (schedule.last_fire && schedule.last_fire.job_id) || "";
  row.dataset.fired = String((schedule.counts && schedule.counts.fired) || 0);
  const actions = el("td", { class: "actions" });
  if (schedule.state === "paused") {
    actions.append(el("button", { type: "button", class: "resume", onclick: () => resumeSchedule(id) }, "Resume"));
  } else {
    actions.append(el("button", { type: "button", class: "pause", onclick: () => pauseSchedule(id) }, "Pause"));
  }
  actions.append(
    el("button", { type: "button", class: "trigger", title: "Fire one tick now", onclick: () => triggerSchedule(id) }, "Run now"),
    el("button", { type: "button", class: "delete", onclick: (e) => deleteSchedule(id, e.currentTarget) }, "Delete"),
  );
  const state_ = el("td", {}, el("span", { class: `status ${schedule.state}` }, schedule.state));
  if (schedule.paused_reason) state_.title = schedule.paused_reason;
  row.replaceChildren(
    el("td", {}, el("a", { href: "#", class: "schedule-link", onclick: (e) => { e.preventDefault(); showSchedule(id); } }, id.slice(0, 8))),
    el("td", { class: "type" }, schedule.type),
    el("td", { class: "expression" }, schedule.schedule),
    el("td", { class: "timezone" }, schedule.timezone),
    state_,
    el("td", { class: "next-fire", title: schedule.next_fire_at || "" }, nextFireText(schedule)),
    el("td", { class: "last-fire" }, ...lastFireNodes(schedule.last_fire)),
    el("td", { class: "counts", title: "ticks fired · jobs submitted · skipped · refused" }, countsText(schedule.counts)),
    actions,
  );
  if (state.scheduleDetailId === id) renderScheduleSummary(schedule);
}

async function loadSchedules(reset) {
  if (reset) {
    state.schedules.clear();
    state.scheduleCursor = null;
    $("schedules").tBodies[0].replaceChildren();
    $("schedules-more").hidden = true;
  }
  if (!signedIn()) return;
  const query = new URLSearchParams({ limit: String(PAGE) });
  if (!reset && state.scheduleCursor) query.set("cursor", state.scheduleCursor);
  await attempt(async () => {
    const { body } = await api("GET", `/schedules?${query}`);
    for (const schedule of body.schedules) addSchedule(schedule);
    state.scheduleCursor = body.next_cursor || null;
    $("schedules-more").hidden = !state.scheduleCursor;
    $("schedules-empty").hidden = state.schedules.size > 0;
  });
}

const schedulePath = (id) => `/schedules/${encodeURIComponent(id)}`;

async function pauseSchedule(id) {
  await attempt(async () => {
    const { body } = await api("POST", `${schedulePath(id)}/pause`, { reason: "paused from the web console" });
    renderSchedule(body);
  });
}

async function resumeSchedule(id) {
  await attempt(async () => {
    const { body } = await api("POST", `${schedulePath(id)}/resume`);
    renderSchedule(body);
  });
}

/** Fires a tick now, then follows it until the schedule records what it came to: its job
 * joins the jobs list (and is watched there). */
async function triggerSchedule(id) {
  await attempt(async () => {
    const { body: tick } = await api("POST", `${schedulePath(id)}/trigger`);
    const deadline = Date.now() + 30000;
    while (Date.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 500));
      const { body: schedule } = await api("GET", schedulePath(id));
      renderSchedule(schedule);
      const fire = schedule.last_fire;
      // Both are the API's RFC 3339 times in UTC with milliseconds: they sort as text.
      if (fire && fire.scheduled_at >= tick.scheduled_at) {
        if (fire.job_id && !state.rows.has(fire.job_id)) {
          const { body: job } = await api("GET", `/jobs/${encodeURIComponent(fire.job_id)}`);
          addJob(job, true);
        }
        if (state.scheduleDetailId === id) await showSchedule(id);
        return;
      }
    }
  });
}

/** Whether this click of a Delete button confirms the one before it (within a few seconds):
 * a first click only asks "Really delete?" (no blocking confirm dialog). */
function confirmedDelete(button) {
  if (button.classList.contains("confirming")) return true;
  button.classList.add("confirming");
  button.textContent = "Really delete?";
  setTimeout(() => {
    button.classList.remove("confirming");
    button.textContent = "Delete";
  }, 4000);
  return false;
}

/** Deletes on a second click within a few seconds. */
async function deleteSchedule(id, button) {
  if (!confirmedDelete(button)) return;
  await attempt(async () => {
    await api("DELETE", schedulePath(id));
    const entry = state.schedules.get(id);
    if (entry) entry.row.remove();
    state.schedules.delete(id);
    $("schedules-empty").hidden = state.schedules.size > 0;
    if (state.scheduleDetailId === id) closeSchedule();
  });
}

/** A schedule's spec, state, ticks and its most recent jobs. */
async function showSchedule(id) {
  state.scheduleDetailId = id;
  await attempt(async () => {
    const query = new URLSearchParams({ schedule_id: id, limit: "5" });
    const [{ body: schedule }, { body: jobs }] = await Promise.all([
      api("GET", schedulePath(id)),
      api("GET", `/jobs?${query}`),
    ]);
    renderSchedule(schedule);
    renderScheduleSummary(schedule);
    const rows = jobs.jobs || [];
    $("schedule-jobs").tBodies[0].replaceChildren(
      ...rows.map((job) => el(
        "tr", { "data-job-id": job.job_id },
        el("td", {}, jobLink(job.job_id)),
        el("td", {}, el("span", { class: `status ${job.status}` }, job.status)),
        el("td", { class: "created" }, fmtTime(job.created_at)),
        el("td", { class: "created" }, fmtTime(job.finished_at)),
      )),
    );
    $("schedule-no-jobs").hidden = rows.length > 0;
    $("schedule-detail-section").hidden = false;
    $("schedule-detail-section").scrollIntoView({ block: "nearest" });
  });
}

function renderScheduleSummary(schedule) {
  $("schedule-detail-id").textContent = schedule.schedule_id;
  const summary = $("schedule-summary");
  summary.replaceChildren();
  const add = (name, ...value) => {
    if (value.length === 0 || value[0] === undefined || value[0] === null || value[0] === "") return;
    summary.append(el("dt", {}, name), el("dd", {}, ...value.map((v) => (v instanceof Node ? v : String(v)))));
  };
  add("Type", schedule.type);
  add("Params", JSON.stringify(schedule.params));
  add("Expression", schedule.schedule);
  add("Time zone", schedule.timezone);
  add("Overlap", schedule.overlap);
  add("Priority", schedule.priority);
  add("State", schedule.paused_reason ? `${schedule.state} (${schedule.paused_reason})` : schedule.state);
  if (schedule.pause_on_failure) add("On failure", "pause the schedule");
  add("Not before", fmtTime(schedule.start_at));
  add("Not after", fmtTime(schedule.end_at));
  add("Callback", schedule.callback_url);
  add("Next fire", nextFireText(schedule));
  add("Last fire", ...lastFireNodes(schedule.last_fire));
  if (schedule.held) add("Held", `tick ${fmtTime(schedule.held.scheduled_at)}, until the live job ends`);
  add("Ticks", countsText(schedule.counts));
  add("Created", fmtTime(schedule.created_at));
  add("Updated", fmtTime(schedule.updated_at));
  $("schedule-raw").textContent = JSON.stringify(schedule, null, 2);
}

function closeSchedule() {
  state.scheduleDetailId = null;
  $("schedule-detail-section").hidden = true;
}

// ------------------------------------------------------------------ webhook endpoints

const endpointPath = (id) => `/webhooks/endpoints/${encodeURIComponent(id)}`;

/** Why an endpoint is not simply healthy ("" when it is). */
function endpointHealth(endpoint) {
  if (endpoint.status === "disabled") {
    const why = {
      gone: "it answered 410 Gone",
      failing: "every attempt failed for too long",
    }[endpoint.disabled_reason] || endpoint.disabled_reason || "";
    return `disabled ${fmtTime(endpoint.disabled_at)}${why ? ` (${why})` : ""}`;
  }
  if (endpoint.failing_since) return `failing since ${fmtTime(endpoint.failing_since)}`;
  return "";
}

/** Shows an endpoint in the list. */
function addEndpoint(endpoint) {
  listEntry(state.endpoints, "endpoints", "data-endpoint-id", endpoint.endpoint_id);
  renderEndpoint(endpoint);
}

function renderEndpoint(endpoint) {
  const entry = state.endpoints.get(endpoint.endpoint_id);
  if (!entry) return;
  entry.endpoint = endpoint;
  const id = endpoint.endpoint_id;
  const row = entry.row;
  row.dataset.status = endpoint.status;
  row.dataset.disabledReason = endpoint.disabled_reason || "";
  row.dataset.failingSince = endpoint.failing_since || "";
  const actions = el("td", { class: "actions" });
  if (endpoint.status === "disabled") {
    actions.append(el("button", { type: "button", class: "enable", onclick: () => enableEndpoint(id) }, "Enable"));
  }
  actions.append(
    el("button", { type: "button", class: "deliveries", onclick: () => showEndpoint(id) }, "Deliveries"),
    el("button", { type: "button", class: "delete", onclick: (e) => deleteEndpoint(id, e.currentTarget) }, "Delete"),
  );
  const description = endpoint.description ? el("span", { class: "description" }, endpoint.description) : null;
  row.replaceChildren(
    el("td", {}, el("a", { href: "#", class: "endpoint-link", onclick: (e) => { e.preventDefault(); showEndpoint(id); } }, id)),
    el("td", {}, el("span", { class: `status ${endpoint.status}` }, endpoint.status)),
    el("td", { class: "url" }, endpoint.url, description),
    el("td", { class: "events" }, (endpoint.events || []).join(", ")),
    el("td", { class: "health" }, endpointHealth(endpoint)),
    actions,
  );
  if (state.endpointDetailId === id) renderEndpointSummary(endpoint);
}

async function loadEndpoints() {
  state.endpoints.clear();
  $("endpoints").tBodies[0].replaceChildren();
  if (!signedIn()) return;
  await attempt(async () => {
    // One page: an owner has a handful of endpoints at most (the deployment's limit).
    const { body } = await api("GET", "/webhooks/endpoints");
    for (const endpoint of body.endpoints) addEndpoint(endpoint);
    $("endpoints-empty").hidden = state.endpoints.size > 0;
  });
}

/** The events ticked in the form. */
function formEvents() {
  return [...document.querySelectorAll("input[name='endpoint-event']:checked")].map((box) => box.value);
}

async function createEndpoint(event) {
  event.preventDefault();
  await attempt(async () => {
    const request = { url: $("endpoint-url").value.trim(), events: formEvents() };
    const description = $("endpoint-description").value.trim();
    if (description) request.description = description;
    const { body } = await api("POST", "/webhooks/endpoints", request);
    addEndpoint(body);
    $("endpoints-empty").hidden = true;
    $("endpoint-url").value = "";
    $("endpoint-description").value = "";
    state.endpoints.get(body.endpoint_id).row.scrollIntoView({ block: "nearest" });
  });
}

async function enableEndpoint(id) {
  await attempt(async () => {
    const { body } = await api("POST", `${endpointPath(id)}/enable`);
    renderEndpoint(body);
    if (state.endpointDetailId === id) {
      $("recover-result").textContent = "Enabled: events are sent to it again. Recover here what failed meanwhile.";
    }
  });
}

/** Deletes on a second click within a few seconds. */
async function deleteEndpoint(id, button) {
  if (!confirmedDelete(button)) return;
  await attempt(async () => {
    await api("DELETE", endpointPath(id));
    const entry = state.endpoints.get(id);
    if (entry) entry.row.remove();
    state.endpoints.delete(id);
    $("endpoints-empty").hidden = state.endpoints.size > 0;
    if (state.endpointDetailId === id) closeEndpoint();
  });
}

/** A `datetime-local` value (the browser's zone, to the second) for `date`. */
function localInputValue(date) {
  const pad = (n) => String(n).padStart(2, "0");
  return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())}`
    + `T${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())}`;
}

/** An endpoint's view: its spec and health, a recovery, and its deliveries. */
async function showEndpoint(id) {
  const switched = state.endpointDetailId !== id;
  state.endpointDetailId = id;
  await attempt(async () => {
    const { body } = await api("GET", endpointPath(id));
    renderEndpoint(body);
    renderEndpointSummary(body);
    if (switched) {
      $("recover-result").textContent = "";
      delete $("recover-result").dataset.requeued;
      // What failed in the last day, unless the user says otherwise.
      $("recover-since").value = localInputValue(new Date(Date.now() - 24 * 3600 * 1000));
    }
    await loadEndpointDeliveries(true);
    $("endpoint-detail-section").hidden = false;
    $("endpoint-detail-section").scrollIntoView({ block: "nearest" });
  });
}

function renderEndpointSummary(endpoint) {
  $("endpoint-detail-id").textContent = endpoint.endpoint_id;
  const add = summaryList($("endpoint-summary"));
  add("URL", endpoint.url);
  add("Events", (endpoint.events || []).join(", "));
  add("Description", endpoint.description);
  add("Status", endpoint.status);
  add("Health", endpointHealth(endpoint));
  add("Created", fmtTime(endpoint.created_at));
  add("Updated", fmtTime(endpoint.updated_at));
  $("endpoint-raw").textContent = JSON.stringify(endpoint, null, 2);
}

/** A page of the open endpoint's deliveries in the chosen status (newest job first). */
async function loadEndpointDeliveries(reset) {
  const id = state.endpointDetailId;
  if (!id) return;
  if (reset) {
    state.deliveryCursor = null;
    $("endpoint-deliveries").tBodies[0].replaceChildren();
  }
  const query = new URLSearchParams({ limit: String(PAGE) });
  if ($("endpoint-deliveries-status").value) query.set("status", $("endpoint-deliveries-status").value);
  if (!reset && state.deliveryCursor) query.set("cursor", state.deliveryCursor);
  const { body } = await api("GET", `${endpointPath(id)}/deliveries?${query}`);
  const rows = $("endpoint-deliveries").tBodies[0];
  rows.append(...body.deliveries.map(deliveryRow));
  state.deliveryCursor = body.next_cursor || null;
  $("endpoint-deliveries-more").hidden = !state.deliveryCursor;
  $("endpoint-no-deliveries").hidden = rows.rows.length > 0;
}

/** One delivery of an endpoint: its job and event, where it stands, its last attempt. */
function deliveryRow(delivery) {
  const row = el("tr", { "data-webhook-id": delivery.webhook_id, "data-job-id": delivery.job_id, "data-status": delivery.status });
  const actions = el("td", { class: "actions" });
  // A pending one is queued already; progress is never sent again (the next one says more).
  if (delivery.status !== "pending" && delivery.event !== "job.progress") {
    actions.append(el("button", {
      type: "button", class: "resend", title: "Send it again (same webhook-id)",
      onclick: (e) => resendDelivery(delivery.webhook_id, row, e.currentTarget),
    }, "Resend"));
  }
  row.append(
    // Whole ids: jobs queued close together share their first (time) digits.
    el("td", {}, jobLink(delivery.job_id)),
    el("td", {}, delivery.event),
    el("td", { class: "delivery-status" }, el("span", { class: `status ${delivery.status}` }, delivery.status)),
    el("td", {}, String(delivery.attempts ?? "")),
    el("td", { class: "created" }, fmtTime(delivery.last_attempt_at)),
    el("td", {}, delivery.status_code == null ? "" : String(delivery.status_code)),
    el("td", {}, delivery.error || ""),
    actions,
  );
  return row;
}

async function resendDelivery(webhookId, row, button) {
  await attempt(async () => {
    button.disabled = true;
    try {
      const { body } = await api("POST", `/webhooks/deliveries/${encodeURIComponent(webhookId)}/resend`);
      row.dataset.status = body.status;
      row.querySelector(".delivery-status").replaceChildren(el("span", { class: `status ${body.status}` }, `${body.status} (resent)`));
      button.remove();
    } finally {
      button.disabled = false;
    }
  });
}

/** Queues again every failed delivery since the chosen time: one call walks a bounded part,
 * so it is repeated with the cursor it answers until it says the walk is complete. */
async function recoverDeliveries(event) {
  event.preventDefault();
  const id = state.endpointDetailId;
  if (!id) return;
  const result = $("recover-result");
  let requeued = 0;
  await attempt(async () => {
    const since = isoFromLocal($("recover-since").value);
    if (!since) throw new ApiError(0, "Invalid time", "Choose the time to recover from.");
    result.textContent = "recovering…";
    delete result.dataset.requeued;
    let cursor;
    try {
      for (;;) {
        const request = cursor ? { since, cursor } : { since };
        const { body } = await api("POST", `${endpointPath(id)}/recover`, request);
        requeued += body.requeued || 0;
        if (body.complete) break;
        if (!body.cursor || body.cursor === cursor) {
          throw new ApiError(0, "Unexpected answer", "The recovery is not complete but names no new cursor to go on from.");
        }
        cursor = body.cursor;
      }
    } catch (err) {
      result.textContent = requeued ? `${requeued} queued again before this failed; repeat to go on.` : "";
      throw err;
    }
    const noun = requeued === 1 ? "delivery" : "deliveries";
    result.textContent = `${requeued} failed ${noun} since ${fmtTime(since)} queued again.`;
    result.dataset.requeued = String(requeued);
    await loadEndpointDeliveries(true);
  });
}

function closeEndpoint() {
  state.endpointDetailId = null;
  $("endpoint-detail-section").hidden = true;
}

// ------------------------------------------------------------------ start

function start() {
  readTokenFromFragment();
  $("token").value = token();
  $("api-base").value = localStorage.getItem(API_KEY) || "";
  document.body.dataset.signedIn = String(signedIn());

  $("auth").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
    document.body.dataset.signedIn = String(signedIn());
    loadJobTypes();
    loadJobs(true);
    loadSchedules(true);
    loadEndpoints();
  });
  $("sign-out").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    $("token").value = "";
    document.body.dataset.signedIn = "false";
    loadJobs(true);
    loadSchedules(true);
    closeSchedule();
    loadEndpoints();
    closeEndpoint();
  });
  $("save-api").addEventListener("click", () => {
    const base = $("api-base").value.trim();
    if (base) localStorage.setItem(API_KEY, base);
    else localStorage.removeItem(API_KEY);
    loadJobTypes();
    loadJobs(true);
    loadSchedules(true);
    loadEndpoints();
  });
  $("problem-close").addEventListener("click", clearProblem);
  $("refresh").addEventListener("click", () => loadJobs(true));
  $("more").addEventListener("click", () => loadJobs(false));
  $("filter-status").addEventListener("change", () => loadJobs(true));
  $("filter-type").addEventListener("change", () => loadJobs(true));
  $("job-type").addEventListener("change", renderParams);
  $("raw-mode").addEventListener("change", () => {
    const raw = $("raw-mode").checked;
    if (raw) $("raw-params").value = JSON.stringify(formParams(false), null, 2);
    $("raw-params").hidden = !raw;
    $("params-fields").hidden = raw;
    // A disabled fieldset's (required) fields are left out of the form's validation.
    $("params-fields").disabled = raw;
  });
  $("submit-form").addEventListener("submit", submit);
  fillTimeZones();
  $("schedule-mode").addEventListener("change", () => setScheduleMode($("schedule-mode").checked));
  setScheduleMode($("schedule-mode").checked);
  $("schedules-refresh").addEventListener("click", () => loadSchedules(true));
  $("schedules-more").addEventListener("click", () => loadSchedules(false));
  $("schedule-detail-close").addEventListener("click", closeSchedule);
  $("endpoints-refresh").addEventListener("click", loadEndpoints);
  $("endpoint-form").addEventListener("submit", createEndpoint);
  $("endpoint-detail-close").addEventListener("click", closeEndpoint);
  $("recover-form").addEventListener("submit", recoverDeliveries);
  $("endpoint-deliveries-status").addEventListener("change", () => attempt(() => loadEndpointDeliveries(true)));
  $("endpoint-deliveries-more").addEventListener("click", () => attempt(() => loadEndpointDeliveries(false)));
  $("detail-close").addEventListener("click", () => {
    state.detailId = null;
    $("detail-section").hidden = true;
  });

  if (signedIn()) {
    loadJobTypes();
    loadJobs(true);
    loadSchedules(true);
    loadEndpoints();
  }
}

start();
