//! The kind run through the worker API's in-memory host: stages, cadence, resumption.

use super::*;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use longhaul_worker::testing::{Host, assert_resumable};
use longhaul_worker::{ByteStream, ErrorClass, ResultRef, ResultUpload, UploadedPart};
use proptest::prelude::*;
use serde_json::{Value, json};

const INPUT: &str = "uploads/owner/1/sales.csv";

fn params(format: &str) -> Value {
    json!({"input": INPUT, "group_by": ["region"], "format": format,
        "metrics": [{"op": "count"}, {"op": "sum", "column": "amount"}]})
}

/// The report computed directly, in one pass.
fn expected(params: &Value, csv: &[u8]) -> Vec<u8> {
    let params: CsvReportParams = serde_json::from_value(params.clone()).unwrap();
    let mut scanner = Scanner::new(&params, ScanState::default());
    scanner.feed(csv).unwrap();
    render(&params, &scanner.finish().unwrap()).encode(params.format)
}

fn csv(rows: &[(u8, i32)]) -> Vec<u8> {
    let mut out = b"region,amount\n".to_vec();
    for (region, amount) in rows {
        out.extend(format!("r{region},{amount}\n").into_bytes());
    }
    out
}

#[test]
fn the_three_stages_publish_the_report() {
    let data = csv(&[(1, 5), (2, 7), (1, -2)]);
    for (format, name) in [("json", "report.json"), ("csv", "report.csv")] {
        let host = Host::new().input(INPUT, data.clone(), 4);
        let finished = host.run(&CsvReport, &params(format)).unwrap();
        assert_eq!(finished.name, name);
        assert_eq!(finished.body, expected(&params(format), &data));
        assert_eq!(
            finished.summary,
            Some(serde_json::json!({"rows_scanned": 3, "groups": 2, "invalid_cells": {}})),
            "the summary beside the report"
        );
    }
}

#[test]
fn the_stages_are_typed_and_an_unknown_name_is_refused() {
    for &name in CsvReport.stages() {
        assert!(Stage::parse(name).is_ok(), "{name}");
    }
    assert_eq!(
        CsvReport.stages().iter().map(|n| Stage::parse(n).unwrap()).collect::<Vec<_>>(),
        [Stage::Scan, Stage::Render, Stage::Publish]
    );
    for bad in ["", "pubilsh", "Publish", "publish ", "done"] {
        let err = Stage::parse(bad).unwrap_err();
        assert_eq!(err.class, ErrorClass::Fatal, "{bad:?}");
        assert_eq!(err.public.as_str(), "the job is at a stage its kind does not have");
        assert!(err.to_string().contains(&format!("no stage {bad:?}")), "{err}");
    }
}

/// `csv_report` with its last stage's name mistyped: the run must fail there, not publish
/// (a catch-all arm once ran `publish` for any name).
#[derive(Clone, Copy)]
struct Mistyped;

impl JobKind for Mistyped {
    const NAME: &'static str = CsvReport::NAME;
    type Params = CsvReportParams;

    fn stages(&self) -> &'static [&'static str] {
        &["scan", "render", "pubilsh"]
    }

    fn inputs(&self, params: &CsvReportParams) -> Vec<String> {
        CsvReport.inputs(params)
    }

    async fn run_stage(
        &self,
        ctx: &mut dyn StageContext,
        params: &CsvReportParams,
    ) -> Result<StageOutcome, KindError> {
        CsvReport.run_stage(ctx, params).await
    }
}

#[test]
fn a_mistyped_stage_fails_the_job_instead_of_running_another() {
    let host = Host::new().input(INPUT, csv(&[(1, 5)]), 64);
    let err = host.run(&Mistyped, &params("json")).unwrap_err();
    assert_eq!(err.class, ErrorClass::Fatal);
    assert!(err.to_string().contains("no stage \"pubilsh\""), "{err}");
}

#[test]
fn the_owners_data_errors_are_fatal_and_said_as_they_are() {
    let host = Host::new().input(INPUT, b"region,price\nx,1\n".to_vec(), 64);
    let err = host.run(&CsvReport, &params("json")).unwrap_err();
    assert_eq!(err.class, ErrorClass::Fatal);
    assert!(err.public.as_str().contains("amount"), "{err}");
    let err = Host::new().run(&CsvReport, &params("json")).unwrap_err();
    assert_eq!(
        err.public.as_str(),
        "the input upload does not exist (upload it before submitting the job)"
    );
}

#[test]
fn a_cancellation_mid_scan_ends_the_run() {
    let host = Host::new().input(INPUT, csv(&[(1, 1); 50]), 8).cancel_after_writes(5);
    let (result, trace) = host.run_traced(&CsvReport, &params("json"));
    assert!(result.unwrap_err().is_cancelled());
    assert!(trace.final_checkpoint, "where it stopped is kept for a retry: {trace:?}");
}

/// A `StageContext` that records the byte offset of every checkpoint the scan saves and
/// forwards everything to the host's.
struct Recording<'a> {
    inner: &'a mut dyn StageContext,
    scan_offsets: Arc<Mutex<Vec<u64>>>,
}

impl StageContext for Recording<'_> {
    fn stage(&self) -> &str {
        self.inner.stage()
    }
    fn attempt(&self) -> u32 {
        self.inner.attempt()
    }
    fn progress(&mut self, done: u64, total: Option<u64>) -> BoxFuture<'_, Result<(), KindError>> {
        self.inner.progress(done, total)
    }
    fn save_checkpoint_raw(
        &mut self,
        version: u32,
        state: Value,
        done: u64,
        total: Option<u64>,
    ) -> BoxFuture<'_, Result<(), KindError>> {
        if self.inner.stage() == "scan" {
            assert_eq!(
                state["offset"].as_u64(),
                Some(done),
                "a scan checkpoint's done is its offset"
            );
            self.scan_offsets.lock().unwrap().push(done);
        }
        self.inner.save_checkpoint_raw(version, state, done, total)
    }
    fn load_checkpoint_raw(
        &mut self,
        version: u32,
    ) -> BoxFuture<'_, Result<Option<Value>, KindError>> {
        self.inner.load_checkpoint_raw(version)
    }
    fn has_own_checkpoint(&self) -> bool {
        self.inner.has_own_checkpoint()
    }
    fn carried_raw(
        &mut self,
        from_stage: &str,
        version: u32,
    ) -> BoxFuture<'_, Result<Value, KindError>> {
        self.inner.carried_raw(from_stage, version)
    }
    fn input_size(&mut self, input: &str) -> BoxFuture<'_, Result<u64, KindError>> {
        self.inner.input_size(input)
    }
    fn read_input(
        &mut self,
        input: &str,
        offset: u64,
    ) -> BoxFuture<'_, Result<ByteStream, KindError>> {
        self.inner.read_input(input, offset)
    }
    fn stage_file(
        &mut self,
        name: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> BoxFuture<'_, Result<StagedFile, KindError>> {
        self.inner.stage_file(name, content_type, body)
    }
    fn write_result(
        &mut self,
        name: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> BoxFuture<'_, Result<ResultRef, KindError>> {
        self.inner.write_result(name, content_type, body)
    }
    fn begin_result_upload(
        &mut self,
        name: &str,
        content_type: &str,
    ) -> BoxFuture<'_, Result<ResultUpload, KindError>> {
        self.inner.begin_result_upload(name, content_type)
    }
    fn can_continue(&mut self, upload: &ResultUpload) -> BoxFuture<'_, Result<bool, KindError>> {
        self.inner.can_continue(upload)
    }
    fn upload_part(
        &mut self,
        upload: &ResultUpload,
        number: u32,
        body: Vec<u8>,
    ) -> BoxFuture<'_, Result<UploadedPart, KindError>> {
        self.inner.upload_part(upload, number, body)
    }
    fn complete_result_upload(
        &mut self,
        upload: &ResultUpload,
        parts: &[UploadedPart],
    ) -> BoxFuture<'_, Result<ResultRef, KindError>> {
        self.inner.complete_result_upload(upload, parts)
    }
    fn input_name(&self, input: &str) -> Result<String, KindError> {
        self.inner.input_name(input)
    }
    fn publish(&mut self, staged: &StagedFile) -> BoxFuture<'_, Result<ResultRef, KindError>> {
        self.inner.publish(staged)
    }
    fn pause(
        &mut self,
        duration: Duration,
        done: u64,
        total: Option<u64>,
    ) -> BoxFuture<'_, Result<(), KindError>> {
        self.inner.pause(duration, done, total)
    }
    fn deadline_near(&self) -> bool {
        self.inner.deadline_near()
    }
    fn checkpoint_due(&self, items: u64) -> bool {
        self.inner.checkpoint_due(items)
    }
    fn cancelled(&self) -> bool {
        self.inner.cancelled()
    }
    fn wait_for(
        &mut self,
        name: &str,
        timeout: Duration,
    ) -> BoxFuture<'_, Result<longhaul_worker::Waited, KindError>> {
        self.inner.wait_for(name, timeout)
    }
    fn attempt_failures(&self) -> u32 {
        self.inner.attempt_failures()
    }
    fn count_failure(&mut self) -> BoxFuture<'_, Result<(), KindError>> {
        self.inner.count_failure()
    }

    fn record_shards(
        &mut self,
        counts: longhaul_worker::ShardCounts,
    ) -> BoxFuture<'_, Result<(), KindError>> {
        self.inner.record_shards(counts)
    }

    fn read_staged(
        &mut self,
        staged: &longhaul_worker::StagedFile,
    ) -> BoxFuture<'_, Result<Vec<u8>, KindError>> {
        self.inner.read_staged(staged)
    }
}

/// `csv_report`, run through [`Recording`].
#[derive(Clone, Default)]
struct Recorded {
    scan_offsets: Arc<Mutex<Vec<u64>>>,
}

impl JobKind for Recorded {
    const NAME: &'static str = CsvReport::NAME;
    type Params = CsvReportParams;

    fn stages(&self) -> &'static [&'static str] {
        CsvReport.stages()
    }

    fn validate(&self, params: &CsvReportParams) -> Result<(), String> {
        CsvReport.validate(params)
    }

    fn inputs(&self, params: &CsvReportParams) -> Vec<String> {
        CsvReport.inputs(params)
    }

    async fn run_stage(
        &self,
        ctx: &mut dyn StageContext,
        params: &CsvReportParams,
    ) -> Result<StageOutcome, KindError> {
        let mut recording = Recording { inner: ctx, scan_offsets: self.scan_offsets.clone() };
        CsvReport.run_stage(&mut recording, params).await
    }
}

/// At least `bytes` of CSV (whole records of a few bytes each).
fn csv_of(bytes: usize) -> Vec<u8> {
    let mut out = b"region,amount\n".to_vec();
    let mut i = 0u32;
    while out.len() < bytes {
        out.extend(format!("r{},{}\n", i % 7, i % 100).into_bytes());
        i += 1;
    }
    out
}

/// The cadence counts MiB of input from the last checkpoint on — not the MiB offset against
/// the byte offset the checkpoint saved, which fired once and never again.
#[test]
fn the_scan_checkpoints_every_mib_of_its_cadence() {
    let data = csv_of(8 * MIB as usize);
    let chunk = 64 << 10;
    let kind = Recorded::default();
    let host = Host::new().input(INPUT, data.clone(), chunk).checkpoint_items(1);
    let finished = host.run(&kind, &params("json")).unwrap();
    assert_eq!(finished.body, expected(&params("json"), &data));
    let offsets = kind.scan_offsets.lock().unwrap().clone();
    // About one a MiB (the last, the scan's end, is its output for the render stage).
    assert!((7..=9).contains(&offsets.len()), "{} scan checkpoints: {offsets:?}", offsets.len());
    assert_eq!(offsets.last(), Some(&(data.len() as u64)));
    let mut from = 0;
    for (i, &offset) in offsets.iter().enumerate() {
        let step = offset - from;
        let last = i + 1 == offsets.len();
        // A checkpoint falls due at the first chunk past the MiB (and at a record's end).
        assert!(
            step <= MIB + chunk as u64,
            "checkpoint {i} at {offset} is {step} bytes on: {offsets:?}"
        );
        assert!(
            last || step >= MIB,
            "checkpoint {i} at {offset} is only {step} bytes on: {offsets:?}"
        );
        from = offset;
    }
    // Resumed after a crash, it goes on checkpointing every MiB: the host counts from the
    // checkpoint resumed, and so does the cadence.
    let kind = Recorded::default();
    let crashing = host.crash_after_checkpoint(3);
    assert_eq!(
        crashing.run(&kind, &params("json")).unwrap().body,
        expected(&params("json"), &data)
    );
    let offsets = kind.scan_offsets.lock().unwrap().clone();
    for pair in offsets.windows(2) {
        assert!(pair[1] - pair[0] <= MIB + chunk as u64, "after the crash too: {offsets:?}");
    }
}

/// The deployment's cadence applies: 3 MiB instead of 1 checkpoints a third as often, and
/// the default (1,000 MiB) not at all before the scan's end.
#[test]
fn the_scan_cadence_follows_the_checkpoint_items_setting() {
    let data = csv_of(8 * MIB as usize);
    let scan_checkpoints = |items: Option<u64>| {
        let kind = Recorded::default();
        let host = Host::new().input(INPUT, data.clone(), 64 << 10);
        let host = match items {
            Some(items) => host.checkpoint_items(items),
            None => host,
        };
        host.run(&kind, &params("json")).unwrap();
        kind.scan_offsets.lock().unwrap().clone()
    };
    let every_3 = scan_checkpoints(Some(3));
    assert_eq!(every_3.len(), 3, "at 3 and 6 MiB, then the end: {every_3:?}");
    assert_eq!(scan_checkpoints(None), vec![data.len() as u64], "only the scan's end");
}

#[test]
fn the_mib_cadence_counts_from_the_last_checkpoint_in_the_hosts_terms() {
    // An invocation resumed from the checkpoint at 5.5 MiB: the host counts from its `done`.
    let at = 5 * MIB + MIB / 2;
    let mut cadence = MibCadence::resumed_at(at);
    assert_eq!(cadence.items_at(at), at);
    assert_eq!(cadence.items_at(at + MIB - 1), at);
    assert_eq!(cadence.items_at(at + MIB), at + 1);
    // Saved at 7 MiB: the host counts from that `done`, the MiB from that offset.
    cadence.saved(7 * MIB);
    assert_eq!(cadence.items_at(7 * MIB), 7 * MIB);
    assert_eq!(cadence.items_at(8 * MIB - 1), 7 * MIB);
    assert_eq!(cadence.items_at(9 * MIB), 7 * MIB + 2);
    // An offset behind the mark (never in a scan) asks for nothing rather than wrapping.
    assert_eq!(cadence.items_at(0), 7 * MIB);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Crashed right after any checkpoint — mid-scan, at the scan's end, after the render
    /// (the case that once failed jobs) — and resumed, a run publishes the same report.
    #[test]
    fn a_run_resumed_after_any_checkpoint_gives_the_same_report(
        rows in proptest::collection::vec((0u8..4, -50i32..50), 0..30),
        chunk in 1usize..16,
        deadline in proptest::option::of(2u32..6),
        format in prop_oneof![Just("json"), Just("csv")],
    ) {
        let data = csv(&rows);
        let host = match deadline {
            None => Host::new().input(INPUT, data.clone(), chunk),
            // An invocation must get past at least one record (the header's 14 bytes and
            // one row), or it would pause at the same offset for ever — as a real one
            // whose deadline is shorter than one record's read would.
            Some(n) => Host::new().input(INPUT, data.clone(), chunk.max(12)).deadline_every(n),
        };
        let params = params(format);
        prop_assert_eq!(host.run(&CsvReport, &params).unwrap().body, expected(&params, &data));
        assert_resumable(&CsvReport, &host, &params);
    }
}

/// About `bytes` of CSV whose quoted fields hold commas, quotes and line breaks (CRLF and
/// LF), so shard cuts fall inside quoted fields and between the halves of a CRLF.
fn quoted_csv_of(bytes: usize) -> Vec<u8> {
    let mut out = b"region,amount\r\n".to_vec();
    let mut i = 0u32;
    while out.len() < bytes {
        let row = match i % 5 {
            0 => format!("r{},{}\r\n", i % 7, i % 100),
            1 => format!("\"r{}, \"\"north\"\"\",{}.25\n", i % 3, i % 50),
            2 => format!("\"multi\r\nline {}\nregion\",{}\r\n", i % 4, i % 9),
            3 => format!("r{},x{}\n\n", i % 7, i),
            _ => format!("\"{}\",\" {} \"\r\n", "q\n".repeat((i % 40) as usize), i % 13),
        };
        out.extend(row.into_bytes());
        i += 1;
    }
    out
}

fn sharded_params(shard_bytes: u64) -> Value {
    let mut params = params("json");
    params["shard_bytes"] = json!(shard_bytes);
    params
}

/// An input over `shard_bytes` is scanned in shards (run out of order by the host) and
/// reports exactly what the plain scan reports; crashed and resumed after any checkpoint, or
/// paused by deadlines inside its shards, it still does. One of at most `shard_bytes` runs
/// plain: no shards.
#[test]
fn a_large_input_scans_in_shards_and_reports_as_the_plain_scan() {
    let data = quoted_csv_of(2 * MIB as usize + 300_000);
    let host = Host::new().input(INPUT, data.clone(), 64 << 10);
    let sharded = sharded_params(MIB);
    let want = expected(&params("json"), &data);
    let (finished, trace) = host.run_traced(&CsvReport, &sharded);
    assert_eq!(finished.unwrap().body, want);
    let counts = trace.shards.last().copied().expect("the scan fanned out");
    assert_eq!((counts.total, counts.succeeded), (3, 3), "{counts:?}");
    assert_resumable(&CsvReport, &host, &sharded);
    let paced = Host::new().input(INPUT, data.clone(), 64 << 10).deadline_every(3);
    assert_eq!(paced.clone().checkpoint_items(1).run(&CsvReport, &sharded).unwrap().body, want);
    let (plain, trace) = host.run_traced(&CsvReport, &sharded_params(data.len() as u64));
    assert_eq!(plain.unwrap().body, want);
    assert!(trace.shards.is_empty(), "at most shard_bytes: scanned plain");
}

/// The owner's data errors are found in a shard as in the plain scan: the job fails with
/// the file's fault, said by byte offset.
#[test]
fn a_shard_finds_the_files_faults() {
    let mut data = quoted_csv_of(2 * MIB as usize);
    data.extend_from_slice(b"r1,2,3\n");
    data.extend(quoted_csv_of(MIB as usize / 2).split_off(15));
    let host = Host::new().input(INPUT, data.clone(), 64 << 10);
    let err = host.run(&CsvReport, &sharded_params(MIB)).unwrap_err();
    assert_eq!(err.class, ErrorClass::Fatal);
    let plain = host.run(&CsvReport, &params("json")).unwrap_err();
    assert!(plain.public.as_str().contains("has 3 fields but the header has 2"), "{plain}");
    // Split ranges say nothing of record numbers: the shard names the record by its offset.
    let at = quoted_csv_of(2 * MIB as usize).len();
    let said = format!("the data record after byte offset {at} has 3 fields but the header has 2");
    assert!(err.public.as_str().contains(&said), "{err}");
}

/// csv_report whose shards hand the merge no reading it can link (as if stray quotes had
/// fooled every one): the merge scans every shard's records again itself.
#[derive(Clone, Copy)]
struct Unlinked;

impl JobKind for Unlinked {
    const NAME: &'static str = CsvReport::NAME;
    type Params = CsvReportParams;

    fn stages(&self) -> &'static [&'static str] {
        CsvReport.stages()
    }

    fn inputs(&self, params: &CsvReportParams) -> Vec<String> {
        CsvReport.inputs(params)
    }

    fn fans_out(&self, stage: &str, params: &CsvReportParams) -> bool {
        CsvReport.fans_out(stage, params)
    }

    async fn split(
        &self,
        ctx: &mut dyn StageContext,
        params: &CsvReportParams,
    ) -> Result<Vec<Shard>, KindError> {
        CsvReport.split(ctx, params).await
    }

    async fn run_shard(
        &self,
        ctx: &mut dyn StageContext,
        params: &CsvReportParams,
        shard: &Shard,
    ) -> Result<ShardOutcome, KindError> {
        sharded::scan_nothing(ctx, params, shard).await
    }

    async fn merge(
        &self,
        ctx: &mut dyn StageContext,
        params: &CsvReportParams,
        outputs: &[ShardOutput],
    ) -> Result<StageOutcome, KindError> {
        CsvReport.merge(ctx, params, outputs).await
    }

    async fn run_stage(
        &self,
        ctx: &mut dyn StageContext,
        params: &CsvReportParams,
    ) -> Result<StageOutcome, KindError> {
        CsvReport.run_stage(ctx, params).await
    }
}

/// A shard none of whose readings links is scanned again by the merge, which reports the
/// same; paused by deadlines inside those scans, or crashed after any checkpoint, it resumes
/// and still does.
#[test]
fn the_merge_scans_again_a_shard_whose_readings_do_not_link() {
    let data = quoted_csv_of(MIB as usize + 400_000);
    let want = expected(&params("json"), &data);
    let host = Host::new().input(INPUT, data.clone(), 64 << 10);
    assert_eq!(host.run(&Unlinked, &sharded_params(MIB)).unwrap().body, want);
    let paced = host.clone().deadline_every(4);
    let (finished, trace) = paced.run_traced(&Unlinked, &sharded_params(MIB));
    assert_eq!(finished.unwrap().body, want);
    assert!(trace.pauses >= 3, "paused inside the rescans: {} pauses", trace.pauses);
    assert_resumable(&Unlinked, &host, &sharded_params(MIB));
}
