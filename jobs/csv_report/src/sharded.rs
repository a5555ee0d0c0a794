//! The scan fanned out: an input larger than `shard_bytes` is scanned in parallel shards.
//!
//! * **split** reads the header row (once: the shards and the merge read it from a staged
//!   file) and cuts the data rows into byte ranges of about `shard_bytes`
//!   ([`domain::shard_ranges`]); a smaller input is scanned plain ([`Shard::whole`]).
//! * **each shard** scans its range speculatively ([`domain::ShardScan`]): it cannot know
//!   whether its first byte is inside a quoted field, so it reads the range under both
//!   assumptions (at the cost of about one scan: the readings join within a record or two)
//!   and checkpoints like the plain scan. Its readings are staged for the merge.
//! * **the merge** links the shards in order ([`domain::Chain`]): of each, the reading that
//!   starts exactly where the previous shard's records ended. Where none does (a file whose
//!   stray quotes fooled both readings), it scans that shard's records again sequentially.
//!   The merged aggregates are the scan's output, as the plain scan's would be.

use futures::TryStreamExt;
use longhaul_worker::{
    Checkpoint, KindError, MAX_SHARDS, PublicMessage, Shard, ShardOutcome, ShardOutput,
    StageContext, StageOutcome, StagedFile,
};
use serde::{Deserialize, Serialize};

use crate::domain::{
    self, Chain, CsvReportParams, Linked, ScanState, Scanner, ShardRange, ShardScan,
    ShardScanState, ShardScanned,
};
use crate::{MibCadence, fatal};

/// The header row as split read it, staged for the shards and the merge (a header may be far
/// larger than a shard's descriptor may).
#[derive(Debug, Serialize, Deserialize)]
struct Header {
    /// The column names.
    names: Vec<String>,
    /// Just past the header row: where the first shard starts.
    end: u64,
}

/// A shard of the scan: its descriptor.
#[derive(Debug, Serialize, Deserialize)]
struct ScanShard {
    header: StagedFile,
    range: ShardRange,
    /// Whether the range starts at a record boundary (the first shard's does).
    at_boundary: bool,
}

/// What a shard hands the merge: its readings, staged (their aggregates may be large).
#[derive(Debug, Serialize, Deserialize)]
struct Scanned {
    header: StagedFile,
    scanned: StagedFile,
}

impl Checkpoint for ShardScanState {
    const VERSION: u32 = 1;
}

/// Where a merge that the deadline interrupted goes on from.
#[derive(Debug, Serialize, Deserialize)]
struct Merging {
    /// The next shard to link.
    next: usize,
    /// The shards linked so far.
    chain: ScanState,
    /// That shard's records being scanned again, as of the last record boundary, and where
    /// the shard ends.
    #[serde(default)]
    rescan: Option<(ScanState, u64)>,
}

impl Checkpoint for Merging {
    // Apart from the scan's output (a `ScanState`, version 1), which the merge saves last.
    const VERSION: u32 = 2;
}

fn unreadable(what: &'static str) -> impl FnOnce(serde_json::Error) -> KindError {
    move |err| KindError::fatal(PublicMessage::fixed(what)).because(err)
}

/// Splits the scan: the whole when the input is at most `shard_bytes` (or ends in its header
/// row), else shards of about `shard_bytes` of data rows each, at most [`MAX_SHARDS`].
pub(crate) async fn split(
    ctx: &mut dyn StageContext,
    params: &CsvReportParams,
) -> Result<Vec<Shard>, KindError> {
    let size = ctx.input_size(&params.input).await?;
    if size <= params.shard_bytes() {
        return Ok(vec![Shard::whole()]);
    }
    let Some(header) = read_header_row(ctx, params).await? else {
        return Ok(vec![Shard::whole()]);
    };
    let ranges = domain::shard_ranges(header.end, size, params.shard_bytes(), MAX_SHARDS);
    if ranges.len() < 2 {
        return Ok(vec![Shard::whole()]);
    }
    let body = serde_json::to_vec(&header).expect("a header serialises");
    let staged = ctx.stage_file("header.json", "application/json", body).await?;
    ranges
        .into_iter()
        .enumerate()
        .map(|(i, range)| {
            let shard = ScanShard { header: staged.clone(), range, at_boundary: i == 0 };
            Shard::new(&shard, range.end - range.start)
        })
        .collect()
}

/// Reads the input until its header row is complete (`None`: the input ends first).
async fn read_header_row(
    ctx: &mut dyn StageContext,
    params: &CsvReportParams,
) -> Result<Option<Header>, KindError> {
    let mut scanner = Scanner::new(params, ScanState::default());
    let mut body = ctx.read_input(&params.input, 0).await?;
    while scanner.header().is_none() {
        let Some(chunk) = body.try_next().await? else { return Ok(None) };
        scanner.feed(&chunk).map_err(fatal)?;
    }
    Ok(scanner
        .header()
        .and_then(|(names, end)| end.map(|end| Header { names: names.to_vec(), end })))
}

async fn read_header(ctx: &mut dyn StageContext, staged: &StagedFile) -> Result<Header, KindError> {
    let body = ctx.read_staged(staged).await?;
    serde_json::from_slice(&body).map_err(unreadable("the scan's header row is unreadable"))
}

/// Scans one shard's range, checkpointing on the scan's cadence (in MiB of the range) and
/// pausing at the deadline; its readings are staged for the merge.
pub(crate) async fn scan_shard(
    ctx: &mut dyn StageContext,
    params: &CsvReportParams,
    shard: &Shard,
) -> Result<ShardOutcome, KindError> {
    let ScanShard { header, range, at_boundary } = shard.descriptor()?;
    let mut scan = match ctx.resume::<ShardScanState>().await? {
        Some(saved) => ShardScan::resume(params, saved),
        None => {
            let names = read_header(ctx, &header).await?.names;
            ShardScan::new(params, &names, range, at_boundary)
        }
    };
    let total = Some(range.end - range.start);
    // Progress counts the range's bytes behind the slowest reading.
    let done = |scan: &ShardScan| scan.position().clamp(range.start, range.end) - range.start;
    ctx.progress(done(&scan), total).await?;
    let mut cadence = MibCadence::resumed_at(done(&scan));
    if !scan.done() {
        let mut at = scan.position();
        let mut body = ctx.read_input(&params.input, at).await?;
        while let Some(chunk) = body.try_next().await? {
            scan.feed(at, &chunk);
            at += chunk.len() as u64;
            if scan.done() {
                break;
            }
            let due = ctx.deadline_near() || ctx.checkpoint_due(cadence.items_at(done(&scan)));
            // No checkpoint while a reading still looks for its first record (at most
            // `SEARCH_BYTES` in): it goes on to the next chunk.
            match scan.checkpoint().filter(|_| due) {
                Some(saved) => {
                    ctx.checkpoint(&saved, done(&scan), total).await?;
                    if ctx.deadline_near() {
                        return Ok(ShardOutcome::Paused);
                    }
                    cadence.saved(done(&scan));
                }
                None => ctx.progress(done(&scan), total).await?,
            }
        }
    }
    let scanned = scan.finish();
    let body = serde_json::to_vec(&scanned).expect("a shard's scan serialises");
    let scanned = ctx.stage_file("scan.json", "application/json", body).await?;
    Ok(ShardOutcome::Done(ShardOutput::new(&Scanned { header, scanned })?))
}

/// Links the shards' scans in shard order into the scan's output (rescanning a shard whose
/// readings do not link), reporting progress (a heartbeat: the merge's count is fixed) and
/// pausing at the deadline between shards and inside a rescan.
pub(crate) async fn merge(
    ctx: &mut dyn StageContext,
    params: &CsvReportParams,
    outputs: &[ShardOutput],
) -> Result<StageOutcome, KindError> {
    // Run again after it saved the scan's output (its invocation died before the stage
    // boundary): done.
    if ctx.resume::<ScanState>().await?.is_some() {
        return Ok(StageOutcome::StageDone);
    }
    let outputs: Vec<Scanned> = outputs.iter().map(ShardOutput::get).collect::<Result<_, _>>()?;
    let Some(first) = outputs.first() else {
        return Err(KindError::fatal(PublicMessage::fixed("the scan has no shards to merge")));
    };
    let header = read_header(ctx, &first.header).await?;
    let (mut chain, from, mut rescanning) = match ctx.resume::<Merging>().await? {
        Some(merging) => (Chain::resume(merging.chain), merging.next, merging.rescan),
        None => (Chain::new(header.names.clone(), header.end), 0, None),
    };
    for (index, output) in outputs.iter().enumerate().skip(from) {
        let rescan = match rescanning.take() {
            Some(partial) => Some(partial),
            None => {
                let body = ctx.read_staged(&output.scanned).await?;
                let scanned: ShardScanned = serde_json::from_slice(&body)
                    .map_err(unreadable("a shard's scan is unreadable"))?;
                match chain.link(scanned).map_err(fatal)? {
                    Linked::Merged => None,
                    Linked::Rescan { from, range } => {
                        tracing::info!(
                            shard = index,
                            from,
                            "no reading of the shard links: scanning it again"
                        );
                        let start = ScanState {
                            offset: from,
                            header: Some(header.names.clone()),
                            ..ScanState::default()
                        };
                        Some((start, range.end))
                    }
                }
            }
        };
        if let Some((state, limit)) = rescan {
            match rescan_records(ctx, params, state, limit).await? {
                Rescanned::Done(state) => chain.rescanned(state).map_err(fatal)?,
                Rescanned::Paused(partial) => {
                    let rescan = Some((partial, limit));
                    let merging = Merging { next: index, chain: chain.state().clone(), rescan };
                    ctx.checkpoint(&merging, 0, None).await?;
                    return Ok(StageOutcome::Paused);
                }
            }
        }
        ctx.progress(0, None).await?;
        if ctx.deadline_near() && index + 1 < outputs.len() {
            let merging = Merging { next: index + 1, chain: chain.state().clone(), rescan: None };
            ctx.checkpoint(&merging, 0, None).await?;
            return Ok(StageOutcome::Paused);
        }
    }
    let state = chain.finish();
    tracing::info!(rows = state.rows_scanned, shards = outputs.len(), "scan merged");
    ctx.checkpoint(&state, 1, Some(1)).await?;
    Ok(StageOutcome::StageDone)
}

/// Where a sequential rescan of a shard's records stopped.
enum Rescanned {
    /// At the shard's end (or the object's): the records' aggregates.
    Done(ScanState),
    /// At the deadline: the state as of its last record boundary, to go on from.
    Paused(ScanState),
}

/// Scans sequentially, from `state` (a record boundary, with what was scanned before it),
/// the records that start before `limit`, reporting progress as it reads.
async fn rescan_records(
    ctx: &mut dyn StageContext,
    params: &CsvReportParams,
    state: ScanState,
    limit: u64,
) -> Result<Rescanned, KindError> {
    let mut scanner = Scanner::for_shard(params, state, limit, None);
    let mut body = ctx.read_input(&params.input, scanner.offset()).await?;
    while !scanner.done() {
        let Some(chunk) = body.try_next().await? else { break };
        scanner.feed(&chunk).map_err(fatal)?;
        if ctx.deadline_near() && !scanner.done() {
            return Ok(Rescanned::Paused(scanner.checkpoint()));
        }
        ctx.progress(0, None).await?;
    }
    scanner.finish().map(Rescanned::Done).map_err(fatal)
}

/// A shard that hands the merge no reading (as if stray quotes had fooled every one), for
/// the merge's rescan to be tested.
#[cfg(test)]
pub(crate) async fn scan_nothing(
    ctx: &mut dyn StageContext,
    _params: &CsvReportParams,
    shard: &Shard,
) -> Result<ShardOutcome, KindError> {
    let ScanShard { header, range, .. } = shard.descriptor()?;
    let scanned = ShardScanned { range, readings: Vec::new(), joined: None };
    let body = serde_json::to_vec(&scanned).expect("a shard's scan serialises");
    let scanned = ctx.stage_file("scan.json", "application/json", body).await?;
    Ok(ShardOutcome::Done(ShardOutput::new(&Scanned { header, scanned })?))
}
