//! The status-index buckets the reaper sweeps and counts, as a type: each sweep, count, saved
//! cursor and report line names one of these, never a string that could be misspelt.

use std::fmt;
use std::str::FromStr;

use longhaul_aws::jobs::WAITING_BUCKET;
use longhaul_domain::JobStatus;
use serde::{Deserialize, Serialize};

/// A live bucket of the status index (`<bucket>#<shard>`): a job's status, or `waiting` for
/// the `pending` jobs that wait for a running slot. In the report (`active`) each is named by
/// its [`Bucket::as_str`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Bucket {
    /// `pending` jobs not waiting for a slot: lost dispatches ([`crate::pending`]).
    Pending,
    /// `pending` jobs waiting for a running slot ([`crate::waiting`]).
    Waiting,
    /// `queued` jobs: lost executions ([`crate::queued`]).
    Queued,
    /// `running` jobs: zombies, stalls, overtime ([`crate::running`]).
    Running,
    /// `paused` jobs, keyed by when their pause lapses: cancelled then ([`crate::paused`]).
    Paused,
    /// `compensating` jobs, keyed by when their worker should next have been heard of:
    /// dispatched again then ([`crate::compensating`]).
    Compensating,
}

impl Bucket {
    /// Every live bucket, in the order the `ActiveJobs` gauge reports them.
    pub const ALL: [Bucket; 6] = [
        Bucket::Pending,
        Bucket::Waiting,
        Bucket::Queued,
        Bucket::Running,
        Bucket::Paused,
        Bucket::Compensating,
    ];

    /// The bucket's name in the status index (and the gauge's `Status` dimension).
    pub fn as_str(self) -> &'static str {
        match self {
            Bucket::Pending => JobStatus::Pending.as_str(),
            Bucket::Waiting => WAITING_BUCKET,
            Bucket::Queued => JobStatus::Queued.as_str(),
            Bucket::Running => JobStatus::Running.as_str(),
            Bucket::Paused => JobStatus::Paused.as_str(),
            Bucket::Compensating => JobStatus::Compensating.as_str(),
        }
    }
}

impl fmt::Display for Bucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is not one of the reaper's buckets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a bucket the reaper sweeps: {0:?}")]
pub struct UnknownBucket(pub String);

impl FromStr for Bucket {
    type Err = UnknownBucket;

    /// The bucket named `name` exactly ([`Bucket::as_str`]); any other text is an error.
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Bucket::ALL
            .into_iter()
            .find(|bucket| bucket.as_str() == name)
            .ok_or_else(|| UnknownBucket(name.chars().take(64).collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use longhaul_aws::metrics::{Metric, NAMESPACE};

    #[test]
    fn a_bucket_reads_back_as_its_name_and_nothing_else_reads() {
        for bucket in Bucket::ALL {
            assert_eq!(bucket.as_str().parse::<Bucket>(), Ok(bucket));
            assert_eq!(serde_json::to_value(bucket).unwrap(), bucket.as_str());
            let read: Bucket = serde_json::from_value(bucket.as_str().into()).unwrap();
            assert_eq!(read, bucket);
        }
        assert_eq!(
            Bucket::ALL.map(Bucket::as_str),
            ["pending", "waiting", "queued", "running", "paused", "compensating"],
            "the index's and the gauge's names"
        );
        for wrong in ["", "Running", "running#0", "succeeded", "expired", "cancelled"] {
            assert_eq!(wrong.parse::<Bucket>(), Err(UnknownBucket(wrong.into())), "{wrong:?}");
            assert!(serde_json::from_value::<Bucket>(wrong.into()).is_err(), "{wrong:?}");
        }
    }

    /// The dashboard (template.yaml) plots every bucket's `ActiveJobs` count and whether it is
    /// exact: a bucket the reaper counts but the dashboard leaves out is a backlog nobody sees.
    #[test]
    fn the_dashboard_plots_every_buckets_count_and_whether_it_is_exact() {
        let template = include_str!("../../../template.yaml");
        for metric in [Metric::ActiveJobs, Metric::ActiveJobsTruncated] {
            for bucket in Bucket::ALL {
                let line = format!(
                    "[\"{NAMESPACE}\", \"{}\", \"Status\", \"{}\"",
                    metric.name(),
                    bucket.as_str()
                );
                assert!(template.contains(&line), "the dashboard has no {line}]");
            }
        }
    }
}
