//! The journal of DynamoDB writes: what a checker reads to prove that no write of an attempt
//! landed after a newer attempt took the job.

use serde::{Deserialize, Serialize};

use super::Faults;

/// One DynamoDB write that took effect.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JournalEntry {
    /// Position in the order the table applied the writes (from 0).
    pub seq: u64,
    /// `dynamodb:UpdateItem`, …
    pub operation: String,
    /// The item's partition key (`JOB#<id>`, …), when the request names one item.
    pub pk: Option<String>,
    /// The item's sort key.
    pub sk: Option<String>,
    /// The lease of the attempt that made the write (`None`: not made by a lease holder).
    pub writer_lease: Option<String>,
    /// The item's `lease` after the write, when the response returned the item.
    pub lease_after: Option<String>,
    /// The item's `status` after the write, when the response returned the item.
    pub status_after: Option<String>,
    /// The table refused the write (its condition failed): it changed nothing. Only writes
    /// made under a lease are journaled when refused.
    #[serde(default)]
    pub refused: bool,
}

impl Faults {
    pub fn journaling(&self) -> bool {
        self.plan.read().expect("fault plan").journal
    }

    /// Journals a DynamoDB write that took effect (`applied`), or that the table refused:
    /// `request` and `response` are the wire bodies. Call it while writes are serialised, so
    /// the journal's order is the table's.
    ///
    /// A write by invocation `invocation` holding no lease that made a job item `running`
    /// under a lease is a claim: the invocation's later calls on that job carry the lease it
    /// minted (the state machine's first stage call claims the job and works in one
    /// invocation, so its event cannot name the lease).
    pub fn journal_write(
        &self,
        operation: &str,
        writer_lease: Option<String>,
        invocation: Option<u64>,
        applied: bool,
        request: &[u8],
        response: &[u8],
    ) {
        let request: serde_json::Value = serde_json::from_slice(request).unwrap_or_default();
        let response: serde_json::Value = serde_json::from_slice(response).unwrap_or_default();
        let key = request.get("Key").or_else(|| request.get("Item"));
        let string = |v: Option<&serde_json::Value>, name: &str| {
            v.and_then(|v| v.get(name))
                .and_then(|a| a.get("S"))
                .and_then(|s| s.as_str())
                .map(str::to_owned)
        };
        // A refused write's answer may carry the item as it is (ALL_OLD): not after the write.
        let attributes = response.get("Attributes").filter(|_| applied);
        let entry = JournalEntry {
            seq: 0,
            operation: operation.to_owned(),
            pk: string(key, "pk"),
            sk: string(key, "sk"),
            writer_lease,
            lease_after: string(attributes, "lease"),
            status_after: string(attributes, "status"),
            refused: !applied,
        };
        if let (Some(invocation), None, Some("JOB"), Some("running"), Some(pk), Some(lease)) = (
            invocation,
            &entry.writer_lease,
            entry.sk.as_deref(),
            entry.status_after.as_deref(),
            &entry.pk,
            &entry.lease_after,
        ) {
            self.claimed
                .lock()
                .expect("claimed leases")
                .insert(invocation, (pk.clone(), lease.clone()));
        }
        let mut journal = self.journal.lock().expect("journal");
        let seq = journal.len() as u64;
        journal.push(JournalEntry { seq, ..entry });
    }

    /// The lease `invocation` minted by claiming job `job_id`, if it did.
    pub(super) fn claimed_lease(&self, invocation: u64, job_id: &str) -> Option<String> {
        let claimed = self.claimed.lock().expect("claimed leases");
        let (pk, lease) = claimed.get(&invocation)?;
        (pk.strip_prefix("JOB#") == Some(job_id)).then(|| lease.clone())
    }

    /// The journal so far.
    pub fn journal(&self) -> Vec<JournalEntry> {
        self.journal.lock().expect("journal").clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checks::faults::{FaultPlan, Invocation};

    #[test]
    fn the_journal_keeps_keys_and_the_lease_after_each_write() {
        let faults = Faults::default();
        faults.set_plan(FaultPlan { journal: true, ..FaultPlan::default() });
        let request = serde_json::json!({"Key": {"pk": {"S": "JOB#1"}, "sk": {"S": "JOB"}}});
        let response =
            serde_json::json!({"Attributes": {"lease": {"S": "t2"}, "status": {"S": "running"}}});
        faults.journal_write(
            "dynamodb:UpdateItem",
            Some("t1".into()),
            Some(7),
            true,
            request.to_string().as_bytes(),
            response.to_string().as_bytes(),
        );
        faults.journal_write("dynamodb:PutItem", None, None, true, b"not json", b"");
        // Refused: journaled, but nothing of the item is read from the answer.
        faults.journal_write(
            "dynamodb:UpdateItem",
            Some("t0".into()),
            None,
            false,
            request.to_string().as_bytes(),
            response.to_string().as_bytes(),
        );
        let journal = faults.journal();
        assert_eq!(journal.len(), 3);
        assert!(!journal[0].refused);
        assert!(journal[2].refused);
        assert_eq!(
            (journal[2].lease_after.as_deref(), journal[2].status_after.as_deref()),
            (None, None)
        );
        assert_eq!(journal[0].pk.as_deref(), Some("JOB#1"));
        assert_eq!(journal[0].writer_lease.as_deref(), Some("t1"));
        assert_eq!(journal[0].lease_after.as_deref(), Some("t2"));
        assert_eq!(journal[0].status_after.as_deref(), Some("running"));
        assert_eq!((journal[1].seq, journal[1].pk.as_deref()), (1, None));
        // Written under a lease: not a claim, nothing learned.
        assert_eq!(faults.claimed_lease(7, "1"), None);
    }

    #[test]
    fn an_invocation_that_claims_its_job_writes_under_the_lease_it_minted() {
        let faults = Faults::default();
        faults.set_plan(FaultPlan { journal: true, ..FaultPlan::default() });
        let request = serde_json::json!({"Key": {"pk": {"S": "JOB#j1"}, "sk": {"S": "JOB"}}});
        let claimed = serde_json::json!({"Attributes": {"lease": {"S": "minted"}, "status": {"S": "running"}}});
        faults.journal_write(
            "dynamodb:UpdateItem",
            None,
            Some(9),
            true,
            request.to_string().as_bytes(),
            claimed.to_string().as_bytes(),
        );
        assert_eq!(faults.claimed_lease(9, "j1").as_deref(), Some("minted"));
        assert_eq!(faults.claimed_lease(9, "j2"), None, "only for the job it claimed");
        assert_eq!(faults.claimed_lease(10, "j1"), None, "only for the invocation that claimed");
        let work = Invocation::new(
            "StageFunction",
            Some(&serde_json::json!({"job_id": "j1", "state": {"lease": {"token": "t3"}}})),
        );
        assert_eq!(work.lease.as_deref(), Some("t3"));
    }
}
