//! csv_report's parallel scan: the wall time of one large input scanned as 1 shard against 2
//! and 4, on the local stack, beside the same scans' compute alone on threads.
//!
//! 1. Generates a CSV of the e2e tests' shape (`longhaul_tests::csvgen`: quoted commas,
//!    doubled quotes and line breaks) of about `LONGHAUL_BENCH_SHARDS_CSV_BYTES` (default
//!    1 GiB).
//! 2. **Compute alone**: the product's scanner over the file in memory, as the plain scan
//!    (1 shard) and as 2 and 4 speculative shard scans on threads, linked by the merge's
//!    chain (best of 2). This is the ceiling: no S3, no orchestration.
//! 3. **On the local stack**: uploads the file once and runs the `csv_report` job with
//!    `shard_bytes` the file's size (scanned plain) and set so the data rows split into 2 and
//!    4 shards (best of 2 each, submit to
//!    `succeeded`, polled every 100 ms). Every report must equal the plain one (sums within
//!    1e-9 relative); the job's `progress.shards` must show the shard count.
//! 4. Writes section `45-csvshards` of BENCHMARKS.md.

use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use longhaul_job_csv_report::domain::{
    Chain, CsvReportParams, Linked, ScanState, Scanner, ShardScan, shard_ranges,
};
use longhaul_local::{LocalStack, Options};
use longhaul_tests::csvgen::{Gen, csv_bytes, rows_match};
use serde_json::{Value, json};

const SEED: u64 = 0x5ca1_ab1e;
const DEFAULT_BYTES: u64 = 1 << 30;
const SHARDS: [u64; 3] = [1, 2, 4];
const RUNS: usize = 2;
/// Bytes per feed (about one TLS record of an S3 GetObject body, as in the csvscan section).
const CHUNK: usize = 16 << 10;
const TIMEOUT: Duration = Duration::from_secs(1800);

fn main() -> anyhow::Result<()> {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build()?;
    runtime.block_on(run())
}

fn params(input: &str, shard_bytes: Option<u64>) -> Value {
    let mut params = json!({
        "input": input,
        "group_by": ["region", "product"],
        "metrics": [{"op": "count"}, {"op": "sum", "column": "amount"},
                    {"op": "min", "column": "amount"}, {"op": "max", "column": "amount"},
                    {"op": "mean", "column": "amount"}],
    });
    if let Some(bytes) = shard_bytes {
        params["shard_bytes"] = json!(bytes);
    }
    params
}

/// `shard_bytes` that splits `size` bytes into `shards` shards (1: the whole, scanned plain).
fn shard_bytes(size: u64, shards: u64) -> u64 {
    size.div_ceil(shards)
}

async fn run() -> anyhow::Result<()> {
    let target: u64 = match std::env::var("LONGHAUL_BENCH_SHARDS_CSV_BYTES") {
        Ok(v) => v.parse().context("LONGHAUL_BENCH_SHARDS_CSV_BYTES must be a byte count")?,
        Err(_) => DEFAULT_BYTES,
    };
    let sample = csv_bytes(&Gen::new(SEED).rows(10_000)).len() as u64;
    let rows = (target * 10_000).div_ceil(sample) as usize;
    let data = csv_bytes(&Gen::new(SEED).rows(rows));
    let size = data.len() as u64;
    ensure!(size >= 4 << 20, "the file must allow 4 shards of at least 1 MiB");
    eprintln!("csvshards: {size} bytes, {rows} rows");

    let load_before = load_average();
    let scan_params: CsvReportParams =
        serde_json::from_value(params("uploads/bench/1/data.csv", None))?;
    let mut compute = Vec::new();
    let mut plain_state = None;
    for shards in SHARDS {
        let mut best = Duration::MAX;
        for _ in 0..RUNS {
            let (took, state) = scan_on_threads(&scan_params, &data, shards)?;
            best = best.min(took);
            let plain = plain_state.get_or_insert_with(|| state.clone());
            ensure!(state.rows_scanned == plain.rows_scanned, "{shards} shards: rows differ");
            ensure!(state.groups.len() == plain.groups.len(), "{shards} shards: groups differ");
        }
        eprintln!("compute, {shards} shard(s): {best:?}");
        compute.push((shards, best));
    }

    longhaul_aws::sdk::install_tls_provider();
    let stack = LocalStack::start(Options::ephemeral(longhaul_bench::workspace_root()))
        .await
        .context("starting the local stack (make venv first)")?;
    let owner: longhaul_domain::Owner = "bench-shards".parse().expect("a principal");
    let client = Client {
        http: reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build()?,
        api: stack.api_url.clone(),
        token: stack.token(&owner),
    };
    let input = client.upload(data).await?;
    let mut stack_runs = Vec::new();
    let mut plain_report: Option<Value> = None;
    for shards in SHARDS {
        let mut best = Duration::MAX;
        for _ in 0..RUNS {
            let body = json!({"type": "csv_report", "params": params(&input, Some(shard_bytes(size, shards)))});
            let started = Instant::now();
            let job_id = client.submit(&body).await?;
            let job = client.wait_terminal(&job_id).await?;
            let took = started.elapsed();
            ensure!(job["status"] == "succeeded", "{shards} shard(s): {job}");
            let fanned = job["progress"]["shards"]["total"].as_u64();
            ensure!(fanned == (shards > 1).then_some(shards), "{shards} shard(s): {job}");
            let report: Value = serde_json::from_slice(&client.result(&job_id).await?)?;
            let plain = plain_report.get_or_insert_with(|| report.clone());
            same_report(plain, &report).with_context(|| format!("{shards} shard(s)"))?;
            best = best.min(took);
        }
        eprintln!("local stack, {shards} shard(s): {best:?}");
        stack_runs.push((shards, best));
    }
    write(size, rows, &compute, &stack_runs, (load_before, load_average()))
}

/// The 1-minute load average (a figure above the core count means other work shared the
/// machine, and the times are overestimates).
fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// The scan of `data` as `shards` shards on threads (1: the plain scan), merged.
fn scan_on_threads(
    params: &CsvReportParams,
    data: &[u8],
    shards: u64,
) -> anyhow::Result<(Duration, ScanState)> {
    let started = Instant::now();
    if shards == 1 {
        let mut scanner = Scanner::new(params, ScanState::default());
        for chunk in data.chunks(CHUNK) {
            scanner.feed(chunk)?;
        }
        return Ok((started.elapsed(), scanner.finish()?));
    }
    let mut head = Scanner::new(params, ScanState::default());
    for chunk in data.chunks(CHUNK) {
        if head.header().is_some() {
            break;
        }
        head.feed(chunk)?;
    }
    let Some((header, Some(header_end))) = head.header() else { bail!("no header row") };
    let header = header.to_vec();
    let size = data.len() as u64;
    let ranges = shard_ranges(header_end, size, size.div_ceil(shards), 10_000);
    let scanned = std::thread::scope(|scope| {
        let running: Vec<_> = ranges
            .iter()
            .enumerate()
            .map(|(i, &range)| {
                let header = &header;
                scope.spawn(move || {
                    let mut scan = ShardScan::new(params, header, range, i == 0);
                    while !scan.done() && (scan.position() as usize) < data.len() {
                        let at = scan.position() as usize;
                        let end = (at + CHUNK).min(data.len());
                        scan.feed(at as u64, &data[at..end]);
                    }
                    scan.finish()
                })
            })
            .collect();
        running.into_iter().map(|h| h.join().expect("a shard thread")).collect::<Vec<_>>()
    });
    let mut chain = Chain::new(header, header_end);
    for shard in scanned {
        ensure!(chain.link(shard)? == Linked::Merged, "a shard of generated data needed a rescan");
    }
    Ok((started.elapsed(), chain.finish()))
}

/// The same groups and counts; sums, minima, maxima and means within 1e-9 relative.
fn same_report(plain: &Value, other: &Value) -> anyhow::Result<()> {
    ensure!(plain["rows_scanned"] == other["rows_scanned"], "rows_scanned differ");
    ensure!(plain["invalid"] == other["invalid"], "invalid counts differ");
    let (a, b) = (plain["rows"].as_array(), other["rows"].as_array());
    let (Some(a), Some(b)) = (a, b) else { bail!("a report without rows") };
    ensure!(a.len() == b.len(), "{} groups vs {}", a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        ensure!(rows_match(y, x), "row {y} ≠ {x}");
    }
    Ok(())
}

struct Client {
    http: reqwest::Client,
    api: String,
    token: String,
}

impl Client {
    async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<(u16, Value)> {
        let mut request = self
            .http
            .request(method.parse()?, format!("{}{path}", self.api))
            .bearer_auth(&self.token);
        if let Some(body) = body {
            request = request
                .json(body)
                .header("idempotency-key", uuid::Uuid::new_v4().simple().to_string());
        }
        let response = request.send().await?;
        let status = response.status().as_u16();
        let text = response.text().await?;
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::String(text))))
    }

    async fn upload(&self, bytes: Vec<u8>) -> anyhow::Result<String> {
        let body =
            json!({"filename": "large.csv", "content_type": "text/csv", "size_bytes": bytes.len()});
        let (status, reply) = self.call("POST", "/uploads", Some(&body)).await?;
        ensure!(status == 201, "uploads answered {status}: {reply}");
        let mut put =
            self.http.put(reply["upload_url"].as_str().context("upload_url")?).body(bytes);
        for (name, value) in reply["headers"].as_object().context("headers")? {
            put = put.header(name, value.as_str().context("header value")?);
        }
        let status = put.send().await?.status();
        ensure!(status.is_success(), "presigned upload answered {status}");
        reply["input"].as_str().map(str::to_owned).context("input")
    }

    async fn submit(&self, body: &Value) -> anyhow::Result<String> {
        let (status, reply) = self.call("POST", "/jobs", Some(body)).await?;
        ensure!(status == 202, "submit answered {status}: {reply}");
        reply["job_id"].as_str().map(str::to_owned).context("job_id")
    }

    async fn wait_terminal(&self, job_id: &str) -> anyhow::Result<Value> {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let (status, job) = self.call("GET", &format!("/jobs/{job_id}"), None).await?;
            ensure!(status == 200, "GET /jobs/{job_id} answered {status}: {job}");
            if matches!(job["status"].as_str(), Some("succeeded" | "failed" | "cancelled")) {
                return Ok(job);
            }
            ensure!(Instant::now() < deadline, "job {job_id} not done after {TIMEOUT:?}: {job}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn result(&self, job_id: &str) -> anyhow::Result<Vec<u8>> {
        let response = self
            .http
            .get(format!("{}/jobs/{job_id}/result", self.api))
            .bearer_auth(&self.token)
            .send()
            .await?;
        let location = response.headers().get("location").context("a result redirect")?;
        let url = location.to_str()?.to_owned();
        Ok(self.http.get(url).send().await?.bytes().await?.to_vec())
    }
}

fn write(
    size: u64,
    rows: usize,
    compute: &[(u64, Duration)],
    stack: &[(u64, Duration)],
    (load_before, load_after): (f64, f64),
) -> anyhow::Result<()> {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mib = size as f64 / (1 << 20) as f64;
    let secs = |d: Duration| d.as_secs_f64();
    let mut table = String::from(
        "| shards | compute alone | speed-up | MiB/s | local stack, submit → succeeded | speed-up | the job less its compute |\n|---|---|---|---|---|---|---|\n",
    );
    for ((shards, alone), (_, whole)) in compute.iter().zip(stack) {
        table.push_str(&format!(
            "| {shards} | {:.2} s | {:.2}× | {:.0} | {:.2} s | {:.2}× | {:.2} s |\n",
            secs(*alone),
            secs(compute[0].1) / secs(*alone),
            mib / secs(*alone),
            secs(*whole),
            secs(stack[0].1) / secs(*whole),
            secs(*whole) - secs(*alone),
        ));
    }
    let body = format!(
        "## csv_report: one input scanned in parallel shards\n\n\
Measured by `tests/bench/src/bin/csvshards.rs` (`make bench`) on this machine ({cores} cores; \
1-minute load average {load_before:.2} before the run, {load_after:.2} after: the machine's own \
background load, which leaves the run less than its cores). \
**Data.** One generated CSV of {size} bytes ({mib:.0} MiB, {rows} rows; the e2e tests' `csvgen` shape: \
quoted commas, doubled quotes and line breaks), grouped by region and product with count, sum, min, \
max and mean of amount. **1 shard** is the plain scan (`shard_bytes` the file's size); 2 and 4 set \
`shard_bytes` to a half and a quarter of it. Best of {RUNS}.\n\n\
{table}\n\
**Compute alone** is the scanner over the file in memory: the plain scan, or the speculative shard scans \
on threads linked by the merge's chain (no rescan was needed: every shard's readings linked). \
**Local stack** is the whole job — upload excluded — through the deployed engine: the split, \
the state machine's Distributed Map running each shard in its own worker invocation (moto's \
interpreter runs the children at once, the local host runs each invocation as a task on a \
4-thread runtime), the merge, render and publish. Every report equals the plain one. *The job \
less its compute* is what is not the scan: reading the object from moto's S3, the \
orchestration, render and publish.\n\n\
**What this shows, and its ceiling here.** This machine has {cores} cores, so 2 shards can at \
best halve the scan and 4 shards cannot beat 2: expect at most about 2×. A speculative shard \
scan costs about one plain scan of its bytes (its readings join within a record or two on \
this data), so the compute column's speed-up is the parallelism the cores allow. The whole \
job on the local stack gains nothing here (fanned out, it is slower), and that is the local \
stack, not the design: moto's S3 (one Python process) serves every shard's stream of the object on the same \
two cores the scans need, the map's states run in moto's interpreter, and each fanned-out job \
pays its orchestration (a manifest, a child execution per shard, a merge reading the staged \
readings) — the last column. On AWS none of that shares a shard's vCPU.\n\n\
**On AWS, on paper.** Each shard is its own worker invocation with its own vCPU (the csv_report \
worker has 1,769 MB: one full vCPU) and its own S3 stream, so N shards scan about N times as \
fast until something shared binds:\n\
- **Concurrency.** At most `max_parallel_shards` shards run at once (policy default 10, capped by \
the `MaxParallelShards` parameter, default 20), within the worker's reserved concurrency (60). \
A 50 GiB input at the 256 MiB default is 200 shards: 20 waves of 10, or 10 of 20.\n\
- **A shard's speed** is the slower of its vCPU's parse (the csvscan section: about 200 MB/s \
here; a Lambda vCPU is comparable or slower) and one S3 GET stream (typically 50–100 MB/s per \
connection): about 1–3 s per 256 MiB shard, plus an invocation's start.\n\
- **S3.** Each shard makes a handful of requests (the header and its range read, its \
checkpoint and staged readings); S3 serves 5,500 GET/HEAD and 3,500 PUT per second per \
prefix, so even 10,000 shards starting together stay far under it, and S3's bandwidth scales \
with connections: it does not bind before the concurrency cap does.\n\
- **Serial parts.** The split (a HEAD, the header row, one PUT), the merge (one GET per shard \
of its staged readings, small unless the report has many groups), render and publish: \
seconds, against the hours one vCPU scans 50 GiB in.\n\
So a 50 GiB scan that takes one worker about 5–15 minutes of parse (more at S3's per-stream \
rate, and hand-overs every 15 minutes) takes 20 parallel shards well under a minute of scan \
plus their start-up; the job's cost is about the same vCPU-seconds, spread out (the jobs \
section prices a fanned-out job's extra transitions and requests).\n"
    );
    longhaul_bench::write_section("45-csvshards", &body)?;
    Ok(())
}
