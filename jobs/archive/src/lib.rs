//! The `archive` job kind: bundles 1 to 1,000 of the caller's uploads into one ZIP file, the
//! job's result, streamed to the store with a multipart upload — so the archive is never whole
//! in memory, can exceed 5 GiB, and a crashed stage resumes without re-uploading the parts it
//! had finished.
//!
//! Params: `{"inputs": ["<input from POST /uploads>", …], "name": "bundle.zip"}`. Each input
//! becomes one entry, in order, named by the upload's file name, made unique (`a.csv`,
//! `a (2).csv`; ignoring case, so extracting on a case-insensitive file system loses nothing);
//! the same input twice makes two entries.
//!
//! # Design
//!
//! One stage, `bundle`. It lays out the whole archive up front ([`format::Layout`]: names and
//! sizes decide every offset), begins a multipart result upload, and streams the inputs through
//! an [`format::Archiver`] that fills parts of a fixed size (5 MiB, or more when the archive
//! would otherwise need over 10,000 parts). After each part is uploaded the stage checkpoints
//! [`Bundling`]: the upload, the uploaded parts, the members (names and sizes) and the
//! [`format::Position`] — archive bytes written (which tells the input and the offset in it to
//! read on from), the CRC-32 of each finished entry and the running CRC of the current one.
//! The checkpoint describes exactly the bytes in uploaded parts; bytes buffered towards the next
//! part are not in it and are read again on resume. A resumed stage continues the upload when
//! the framework says it can (`can_continue`: the same attempt's upload, still open); an
//! earlier attempt's upload is abandoned (the framework aborts it) and the archive starts over.
//!
//! Why the ZIP framing is written here rather than by a crate's writer: a ZIP writer's state
//! (offsets, the central directory so far, a running CRC) lives in the writer object, and no
//! well-kept crate's writer serialises, nor can one be rebuilt mid-entry. A stage invocation
//! ends every 15 minutes at most and may crash, so the writer's state must be data in the
//! checkpoint. The framing is small and fixed ([`format`]: local headers with a data
//! descriptor, the central directory, ZIP64 records where needed), CRC-32 is `crc32fast`
//! (a running CRC is carried across invocations with `Hasher::new_with_initial_len`), and the
//! tests read every archive back with the `zip` crate.
//!
//! Entries are STORED (method 0), not deflated: a stored entry's size is known before its data
//! is read, so the archive's layout is too, and resuming needs only a CRC. Deflate would need,
//! at every part boundary, a full flush of the compressor (so the next invocation can start a
//! fresh compressor on a byte-aligned stream) and the compressed and uncompressed counts and
//! the CRC carried in the checkpoint, with offsets known only as the data is compressed.
//! Uploads are usually already compressed (images, archives, Parquet) or are better
//! compressed by the caller.
//!
//! ZIP64 is written exactly where a value needs it (entries of 4 GiB or more, offsets or the
//! central directory past 4 GiB, 65,535 entries or more); [`format::Zip64::Always`] forces it
//! everywhere for the tests.

pub mod format;

use std::time::Duration;

use futures::TryStreamExt;
use longhaul_worker::{
    Cadence, Checkpoint, JobKind, KindError, MAX_PARTS, MIN_PART_SIZE, Policy, PublicMessage,
    ResultUpload, StageContext, StageOutcome, UploadedPart,
};
use serde::{Deserialize, Serialize};

use format::{Archiver, Layout, LayoutError, Member, Next, Position, Region, Zip64};

/// The most inputs one archive takes.
pub const MAX_INPUTS: usize = 1_000;

/// The largest part the stage buffers (with [`MAX_PARTS`] parts: a 625 GiB archive at most).
pub const MAX_PART_SIZE: usize = 64 * 1024 * 1024;

/// The `archive` kind.
#[derive(Debug, Clone, Copy, Default)]
pub struct Archive;

/// The params of `archive`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ArchiveParams {
    /// The uploads to bundle, in order: `input`s from `POST /uploads`, 1 to 1,000, each one of
    /// the caller's own (the same one twice makes two entries).
    pub inputs: Vec<String>,
    /// The archive's file name: letters, digits, `.`, `_` and `-`, not starting with `.`,
    /// ending in `.zip`, at most 200 bytes.
    #[serde(default = "default_name")]
    pub name: String,
}

fn default_name() -> String {
    "archive.zip".to_owned()
}

/// Checks the params (the message goes to the client as is).
pub fn validate(params: &ArchiveParams) -> Result<(), String> {
    let count = params.inputs.len();
    if !(1..=MAX_INPUTS).contains(&count) {
        return Err(format!("inputs must name 1 to {MAX_INPUTS} uploads, not {count}"));
    }
    if let Some(i) = params.inputs.iter().position(|input| input.trim().is_empty()) {
        return Err(format!(
            "inputs[{i}] must name an upload (the `input` POST /uploads answered)"
        ));
    }
    let name = &params.name;
    // The framework's rule for result file names (one plain path segment), and a .zip.
    let plain = longhaul_worker::is_result_name(name);
    let zip = name.len() > 4 && name.to_ascii_lowercase().ends_with(".zip");
    if !(plain && zip) {
        return Err(format!(
            "name {name:?} must be a file name ending in .zip: letters, digits, '.', '_' and '-', \
             not starting with '.', at most 200 bytes"
        ));
    }
    Ok(())
}

/// Where the `bundle` stage is: its checkpoint, written after every uploaded part.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Bundling {
    /// The result's multipart upload.
    pub upload: ResultUpload,
    /// The parts uploaded, in order (part `i + 1` is `parts[i]`).
    pub parts: Vec<UploadedPart>,
    /// The entries' names and sizes, fixed when the archive began (with the position they
    /// decide every offset: the finished entries' local header offsets are the layout's).
    pub members: Vec<Member>,
    /// Bytes per part (every part but the last).
    pub part_size: usize,
    /// Where the archive stands: bytes in the uploaded parts, the finished entries' CRCs, the
    /// current entry's running CRC.
    pub position: Position,
}

impl Checkpoint for Bundling {
    const VERSION: u32 = 1;
}

impl JobKind for Archive {
    const NAME: &'static str = "archive";
    type Params = ArchiveParams;

    fn stages(&self) -> &'static [&'static str] {
        &["bundle"]
    }

    /// The default policy (results kept a week), with the checkpoint cadence of one part: the
    /// stage checkpoints after every uploaded part (`done` counts input bytes), whatever the
    /// cadence says, since only uploaded bytes can be checkpointed.
    fn policy(&self) -> Policy {
        Policy {
            checkpoint: Cadence { items: MIN_PART_SIZE as u64, interval: Duration::from_secs(60) },
            ..Policy::default()
        }
    }

    fn validate(&self, params: &ArchiveParams) -> Result<(), String> {
        validate(params)
    }

    /// Every input: the framework owner-checks them (another tenant's upload reads as one that
    /// does not exist) and lets the stage read only these.
    fn inputs(&self, params: &ArchiveParams) -> Vec<String> {
        params.inputs.clone()
    }

    async fn run_stage(
        &self,
        ctx: &mut dyn StageContext,
        params: &ArchiveParams,
    ) -> Result<StageOutcome, KindError> {
        bundle(ctx, params).await
    }
}

/// Bytes per part for an archive of `len` bytes: [`MIN_PART_SIZE`], or the whole MiBs that keep
/// it within [`MAX_PARTS`] parts.
pub fn part_size(len: u64) -> Result<usize, KindError> {
    const MIB: u64 = 1024 * 1024;
    let needed = len.div_ceil(u64::from(MAX_PARTS)).div_ceil(MIB) * MIB;
    let size = needed.max(MIN_PART_SIZE as u64);
    if size > MAX_PART_SIZE as u64 {
        return Err(KindError::fatal(PublicMessage::domain(format!(
            "the archive would be {len} bytes, more than the {} an archive may be",
            MAX_PART_SIZE as u64 * u64::from(MAX_PARTS)
        ))));
    }
    Ok(size as usize)
}

fn layout_error(err: LayoutError) -> KindError {
    KindError::fatal(PublicMessage::domain(err))
}

/// Lays the archive out and begins its upload: the stage's first checkpoint.
async fn begin(ctx: &mut dyn StageContext, params: &ArchiveParams) -> Result<Bundling, KindError> {
    let filenames =
        params.inputs.iter().map(|input| ctx.input_name(input)).collect::<Result<Vec<_>, _>>()?;
    let names = format::unique_names(filenames.iter().map(String::as_str));
    let mut members = Vec::with_capacity(names.len());
    for (input, name) in params.inputs.iter().zip(names) {
        members.push(Member { name, size: ctx.input_size(input).await? });
    }
    let layout = Layout::new(members.clone(), Zip64::Auto).map_err(layout_error)?;
    let part_size = part_size(layout.len())?;
    let upload = ctx.begin_result_upload(&params.name, "application/zip").await?;
    let state =
        Bundling { upload, parts: Vec::new(), members, part_size, position: Position::default() };
    // Saved at once, so a crash before the first part continues this upload rather than
    // leaving it for the framework to abort.
    ctx.checkpoint(&state, 0, Some(layout.input_total())).await?;
    Ok(state)
}

/// Uploads the buffered bytes as the next part and checkpoints the position after them.
async fn upload_part(
    ctx: &mut dyn StageContext,
    state: &mut Bundling,
    archiver: &mut Archiver,
) -> Result<(), KindError> {
    let (body, position) = archiver.take_part();
    let number = state.parts.len() as u32 + 1;
    let part = ctx.upload_part(&state.upload, number, body).await?;
    state.parts.push(part);
    state.position = position;
    let layout = archiver.layout();
    let done = layout.inputs_done(state.position.written);
    ctx.checkpoint(&*state, done, Some(layout.input_total())).await
}

fn changed(input: usize, how: &str) -> KindError {
    KindError::fatal(PublicMessage::domain(format!(
        "inputs[{input}] is {how} than its size said (it changed while being archived)"
    )))
}

/// The `bundle` stage: from the last checkpoint (or the start) to the completed upload.
async fn bundle(
    ctx: &mut dyn StageContext,
    params: &ArchiveParams,
) -> Result<StageOutcome, KindError> {
    let mut state = match ctx.resume::<Bundling>().await? {
        Some(state) if ctx.can_continue(&state.upload).await? => state,
        Some(_) => {
            // An earlier attempt's (the framework aborts it), or no longer open.
            tracing::info!("the checkpointed result upload cannot be continued: starting over");
            begin(ctx, params).await?
        }
        None => begin(ctx, params).await?,
    };
    let layout = Layout::new(state.members.clone(), Zip64::Auto).map_err(layout_error)?;
    let total = Some(layout.input_total());
    let mut archiver = Archiver::resume(layout, state.part_size, state.position.clone());
    ctx.progress(archiver.layout().inputs_done(archiver.produced()), total).await?;
    loop {
        match archiver.next() {
            Next::Done => break,
            Next::Bytes(bytes) => {
                let mut rest = bytes.as_slice();
                while !rest.is_empty() {
                    if archiver.part_full() {
                        upload_part(ctx, &mut state, &mut archiver).await?;
                    }
                    rest = &rest[archiver.push(rest)..];
                }
            }
            Next::Input { entry, offset } => {
                let mut body = ctx.read_input(&params.inputs[entry], offset).await?;
                while let Some(chunk) = body.try_next().await? {
                    let mut rest = &chunk[..];
                    while !rest.is_empty() {
                        if archiver.part_full() {
                            upload_part(ctx, &mut state, &mut archiver).await?;
                        }
                        let taken = archiver.push_input(entry, rest);
                        if taken == 0 && !archiver.part_full() {
                            return Err(changed(entry, "longer"));
                        }
                        rest = &rest[taken..];
                    }
                    if ctx.deadline_near() {
                        // The last checkpoint is where the uploaded parts end: the bytes
                        // buffered since are read again by the next invocation.
                        let done = archiver.layout().inputs_done(state.position.written);
                        ctx.checkpoint(&state, done, total).await?;
                        return Ok(StageOutcome::Paused);
                    }
                    ctx.progress(archiver.layout().inputs_done(archiver.produced()), total).await?;
                }
                let position = archiver.layout().locate(archiver.produced());
                if matches!(position, Region::Data { entry: e, .. } if e == entry) {
                    return Err(changed(entry, "shorter"));
                }
            }
        }
    }
    if archiver.buffered() > 0 {
        upload_part(ctx, &mut state, &mut archiver).await?;
    }
    let result = ctx.complete_result_upload(&state.upload, &state.parts).await?;
    Ok(StageOutcome::Finished(result))
}

#[cfg(test)]
mod tests {
    use super::*;
    use longhaul_worker::ErrorClass;
    use longhaul_worker::testing::{Host, PartUploaded, assert_resumable};
    use serde_json::{Value, json};
    use std::io::{Cursor, Read};

    const MIB: usize = 1024 * 1024;
    const A: &str = "uploads/owner/1/data.bin";
    const B: &str = "uploads/owner/2/notes.csv";
    const C: &str = "uploads/owner/3/data.bin";

    fn bytes(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8).collect()
    }

    /// Three uploads, two with the same file name: 8 MiB + 3 MiB + 1 KiB, so three parts.
    fn host(chunk: usize) -> Host {
        Host::new().input(A, bytes(8 * MIB, 1), chunk).input(B, bytes(3 * MIB, 2), chunk).input(
            C,
            bytes(1024, 3),
            chunk,
        )
    }

    fn params() -> Value {
        json!({"inputs": [A, B, C], "name": "bundle.zip"})
    }

    fn unzip(body: &[u8]) -> Vec<(String, Vec<u8>)> {
        let mut archive = zip::ZipArchive::new(Cursor::new(body)).expect("a ZIP archive");
        (0..archive.len())
            .map(|i| {
                let mut file = archive.by_index(i).unwrap();
                let mut data = Vec::new();
                file.read_to_end(&mut data).expect("read, its CRC-32 checked");
                (file.name().unwrap().into_owned(), data)
            })
            .collect()
    }

    fn numbers(parts: &[PartUploaded]) -> Vec<(u32, u32)> {
        parts.iter().map(|p| (p.upload, p.number)).collect()
    }

    #[test]
    fn the_uploads_are_bundled_into_one_zip_uploaded_in_parts() {
        let (finished, trace) = host(100_003).run_traced(&Archive, &params());
        let finished = finished.expect("the job succeeds");
        assert_eq!(
            (finished.name.as_str(), finished.content_type.as_str()),
            ("bundle.zip", "application/zip")
        );
        let entries = unzip(&finished.body);
        let names: Vec<&str> = entries.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["data.bin", "notes.csv", "data (2).bin"]);
        assert_eq!(entries[0].1, bytes(8 * MIB, 1));
        assert_eq!(entries[1].1, bytes(3 * MIB, 2));
        assert_eq!(entries[2].1, bytes(1024, 3));
        // Parts of 5 MiB but the last, each uploaded once, then one checkpoint per part (and
        // one when the upload began).
        assert_eq!(numbers(&trace.parts_uploaded), [(1, 1), (1, 2), (1, 3)]);
        let sizes: Vec<u64> = trace.parts_uploaded.iter().map(|p| p.size).collect();
        assert_eq!(sizes[..2], [MIN_PART_SIZE as u64; 2]);
        assert_eq!(sizes.iter().sum::<u64>(), finished.body.len() as u64);
        assert_eq!(trace.checkpoints, 4);
        assert_eq!(trace.uploads_begun, 1);
    }

    #[test]
    fn larger_inputs_make_more_parts_and_an_empty_input_an_empty_entry() {
        let host = host(1 << 20).input("uploads/owner/4/empty.txt", Vec::new(), 7);
        let params = json!({"inputs": [A, A, "uploads/owner/4/empty.txt", B, C]});
        let (finished, trace) = host.run_traced(&Archive, &params);
        let finished = finished.unwrap();
        assert_eq!(finished.name, "archive.zip", "the default name");
        let entries = unzip(&finished.body);
        let names: Vec<&str> = entries.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["data.bin", "data (2).bin", "empty.txt", "notes.csv", "data (3).bin"]);
        assert_eq!(entries[1].1, bytes(8 * MIB, 1), "the same input twice: two entries");
        assert!(entries[2].1.is_empty());
        assert_eq!(numbers(&trace.parts_uploaded), [(1, 1), (1, 2), (1, 3), (1, 4)], "{trace:?}");
    }

    #[test]
    fn crashed_after_any_checkpoint_or_paused_the_archive_is_the_same() {
        assert_resumable(&Archive, &host(100_003), &params());
        // Paused every 25 chunks of 256 KiB (a part is 20): the same archive, in more
        // invocations.
        let paused = host(256 * 1024).deadline_every(25);
        let (finished, trace) = paused.run_traced(&Archive, &params());
        assert_eq!(finished.unwrap().body, host(100_003).run(&Archive, &params()).unwrap().body);
        assert_eq!(trace.pauses, 2, "{trace:?}");
        assert_resumable(&Archive, &paused, &params());
    }

    #[test]
    fn a_resumed_stage_does_not_upload_its_finished_parts_again() {
        // Checkpoint 2 follows part 1: crashed there, the next invocation uploads parts 2 and 3.
        let (finished, trace) =
            host(100_003).crash_after_checkpoint(2).run_traced(&Archive, &params());
        assert_eq!(finished.unwrap().body, host(100_003).run(&Archive, &params()).unwrap().body);
        assert_eq!(trace.crashes, 1);
        assert_eq!(numbers(&trace.parts_uploaded), [(1, 1), (1, 2), (1, 3)], "{trace:?}");
        // Crashed into a new attempt, the earlier attempt's upload cannot be continued (a
        // zombie could still write to it): it is aborted and the archive starts over.
        let (finished, trace) =
            host(100_003).new_attempt_after_checkpoint(2).run_traced(&Archive, &params());
        assert_eq!(finished.unwrap().attempt, 2);
        assert_eq!(numbers(&trace.parts_uploaded), [(1, 1), (2, 1), (2, 2), (2, 3)], "{trace:?}");
        assert_eq!((trace.uploads_begun, trace.uploads_aborted), (2, 1));
    }

    #[test]
    fn a_completion_whose_answer_was_lost_is_not_built_again() {
        // S3 completed the upload and the invocation died before it heard so: the retried
        // invocation may go on (`can_continue`) and completing again answers the same result.
        let (finished, trace) =
            host(100_003).crash_after_completion().run_traced(&Archive, &params());
        assert_eq!(finished.unwrap().body, host(100_003).run(&Archive, &params()).unwrap().body);
        assert_eq!(trace.crashes, 1, "{trace:?}");
        assert_eq!(numbers(&trace.parts_uploaded), [(1, 1), (1, 2), (1, 3)], "{trace:?}");
        assert_eq!((trace.uploads_begun, trace.uploads_completed), (1, 1), "{trace:?}");
    }

    #[test]
    fn a_cancellation_mid_stage_ends_the_run_at_its_last_part() {
        let (result, trace) = host(100_003).cancel_after_writes(60).run_traced(&Archive, &params());
        assert!(result.unwrap_err().is_cancelled());
        assert!(trace.final_checkpoint, "where it stopped is kept for a retry: {trace:?}");
        assert_eq!(numbers(&trace.parts_uploaded), [(1, 1)], "{trace:?}");
    }

    #[test]
    fn params_are_checked_before_anything_runs() {
        let check = |params: Value| Host::new().run(&Archive, &params).unwrap_err();
        let too_many: Vec<String> = (0..=MAX_INPUTS).map(|i| format!("uploads/o/{i}/f")).collect();
        for (params, says) in [
            (json!({"inputs": []}), "1 to 1000 uploads, not 0"),
            (json!({"inputs": too_many}), "not 1001"),
            (json!({"inputs": [" "]}), "inputs[0] must name an upload"),
            (json!({"inputs": [A], "name": "bundle.tar"}), "ending in .zip"),
            (json!({"inputs": [A], "name": "../x.zip"}), "ending in .zip"),
            (json!({"inputs": [A], "name": ".zip"}), "ending in .zip"),
            (json!({"inputs": [A], "name": "a b.zip"}), "ending in .zip"),
            (json!({"inputs": [A], "extra": 1}), "unknown field"),
        ] {
            let err = check(params.clone());
            assert_eq!(err.class, ErrorClass::Fatal);
            assert!(err.public.as_str().contains(says), "{params}: {err}");
        }
        let ok = ArchiveParams { inputs: vec![A.into()], name: "Q3_report-v2.ZIP".into() };
        assert_eq!(validate(&ok), Ok(()));
    }

    #[test]
    fn a_missing_input_fails_the_job_saying_so() {
        let params = json!({"inputs": [A, "uploads/owner/9/gone.csv"]});
        let err = host(1 << 20).run(&Archive, &params).unwrap_err();
        assert_eq!(err.class, ErrorClass::Fatal);
        assert!(err.public.as_str().contains("does not exist"), "{err}");
    }

    #[test]
    fn parts_grow_past_5_mib_only_when_10000_would_not_do() {
        assert_eq!(part_size(1).unwrap(), MIN_PART_SIZE);
        assert_eq!(part_size(10_000 * MIN_PART_SIZE as u64).unwrap(), MIN_PART_SIZE);
        assert_eq!(part_size(10_000 * MIN_PART_SIZE as u64 + 1).unwrap(), 6 * MIB);
        assert_eq!(part_size(100 << 30).unwrap(), 11 * MIB);
        let most = MAX_PART_SIZE as u64 * u64::from(MAX_PARTS);
        assert_eq!(part_size(most).unwrap(), MAX_PART_SIZE);
        assert_eq!(part_size(most + 1).unwrap_err().class, ErrorClass::Fatal);
    }
}
