//! A stream mapping's persisted position: where a restarted stack resumes reading.

use std::path::Path;

use anyhow::{Context, anyhow};
use serde::{Deserialize, Serialize};

/// A mapping's persisted position.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Checkpoint {
    pub(super) stream_arn: String,
    pub(super) shard_id: String,
    /// The last sequence number done.
    pub(super) sequence_number: String,
}

pub(super) fn load_checkpoint(path: &Path) -> Option<Checkpoint> {
    let text = std::fs::read_to_string(path).ok()?;
    match serde_json::from_str(&text) {
        Ok(checkpoint) => Some(checkpoint),
        Err(err) => {
            tracing::warn!(path = %path.display(), error = %err, "ignoring an unreadable stream checkpoint");
            None
        }
    }
}

/// Writes `checkpoint` atomically (a crash mid-write leaves the previous one).
pub(super) fn save_checkpoint(path: &Path, checkpoint: &Checkpoint) -> anyhow::Result<()> {
    let dir = path.parent().ok_or_else(|| anyhow!("{} has no parent", path.display()))?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let temporary = path.with_extension("json.tmp");
    std::fs::write(&temporary, serde_json::to_vec(checkpoint)?)
        .with_context(|| format!("writing {}", temporary.display()))?;
    std::fs::rename(&temporary, path).with_context(|| format!("replacing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: &str = "arn:aws:dynamodb:us-east-1:123456789012:table/longhaul-JobsTable/stream/2026-11-22T13:46:00.718859";

    #[test]
    fn checkpoints_survive_a_round_trip_and_replace_atomically() {
        let dir = std::env::temp_dir().join(format!("longhaul-streams-{}", uuid::Uuid::new_v4()));
        let path = dir.join("streams").join("F.E.json");
        assert_eq!(load_checkpoint(&path), None);
        let checkpoint = Checkpoint {
            stream_arn: STREAM.into(),
            shard_id: "s".into(),
            sequence_number: "42".into(),
        };
        save_checkpoint(&path, &checkpoint).unwrap();
        save_checkpoint(&path, &Checkpoint { sequence_number: "43".into(), ..checkpoint.clone() })
            .unwrap();
        assert_eq!(load_checkpoint(&path).unwrap().sequence_number, "43");
        std::fs::write(&path, "garbage").unwrap();
        assert_eq!(load_checkpoint(&path), None);
        std::fs::remove_dir_all(dir).ok();
    }
}
