//! The owner's job listing, with opaque cursors.

use super::*;

use std::collections::HashMap;

use longhaul_domain::JobStatus;
use longhaul_domain::cursor;

use crate::AwsError;

/// Filters of a job listing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ListFilter {
    /// Only jobs in this status.
    pub status: Option<JobStatus>,
    /// Only jobs of this type.
    pub job_type: Option<String>,
    /// Only jobs this schedule of the owner's submitted.
    pub schedule_id: Option<longhaul_domain::schedules::ScheduleId>,
}

/// Why a listing failed.
#[derive(Debug, thiserror::Error)]
pub enum ListError {
    /// The cursor is not one we issued to this caller.
    #[error("invalid cursor")]
    InvalidCursor,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The cursor of the owner-index position `key` (a query's `LastEvaluatedKey`) in `owner`'s
/// listing; see [`longhaul_domain::cursor`] for its format.
pub(super) fn encode_cursor(owner: &Owner, key: &Item) -> Result<String, StoreError> {
    let sort_key = key.get("gsi1sk").and_then(|v| v.as_s().ok());
    let position = sort_key.and_then(|k| cursor::ListPosition::from_index_sort_key(k));
    match position {
        Some(position) => Ok(cursor::encode(owner, &position)),
        // Every job record is written by `put_job`, whose sort key always parses.
        None => Err(StoreError::Corrupt {
            key: format!("{:?}", key.get("pk").and_then(|v| v.as_s().ok())),
            reason: format!("owner index sort key {sort_key:?} is not <created_at>#<job id>"),
        }),
    }
}

/// The `ExclusiveStartKey` a cursor stands for. Every part of it is rebuilt from the decoded,
/// validated position, and its partition is always `owner`'s own index: nothing a client
/// sends reaches DynamoDB as a key it did not get from us, nor another tenant's partition.
pub(super) fn decode_cursor(owner: &Owner, cursor: &str) -> Result<Item, ListError> {
    let position = cursor::decode(owner, cursor).map_err(|_| ListError::InvalidCursor)?;
    Ok(HashMap::from([
        ("pk".to_owned(), s(job_pk(&position.job_id))),
        ("sk".to_owned(), s(JOB_SK)),
        ("gsi1pk".to_owned(), s(owner_index_pk(owner))),
        ("gsi1sk".to_owned(), s(position.index_sort_key())),
    ]))
}

/// Where a listing reads: the owner index, or the schedule index's partition of one of the
/// owner's schedules — the index, its partition key's attribute and the partition.
fn listing_index(owner: &Owner, filter: &ListFilter) -> (&'static str, &'static str, String) {
    match &filter.schedule_id {
        Some(id) => (SCHEDULE_INDEX, SCHEDULE_INDEX_PK, schedule_index_pk(owner, id.as_str())),
        None => (OWNER_INDEX, "gsi1pk", owner_index_pk(owner)),
    }
}

impl JobStore {
    /// A page of `owner`'s jobs, newest first, optionally filtered; returns the jobs and the
    /// cursor of the next page. Reads a few index pages if a filter thins them out, so pages
    /// are full whenever more jobs exist.
    pub async fn list(
        &self,
        owner: &Owner,
        filter: &ListFilter,
        limit: usize,
        cursor: Option<&str>,
    ) -> Result<(Vec<JobEntry>, Option<String>), ListError> {
        let (index, partition, key) = listing_index(owner, filter);
        let mut start = cursor
            .map(|c| {
                let mut start = decode_cursor(owner, c)?;
                if filter.schedule_id.is_some() {
                    // The same position, in the schedule index's partition.
                    start.remove("gsi1pk");
                    start.insert(partition.to_owned(), s(key.clone()));
                }
                Ok::<_, ListError>(start)
            })
            .transpose()?;
        let mut jobs = Vec::new();
        for _ in 0..5 {
            let mut query = self
                .client
                .query()
                .table_name(&self.table)
                .index_name(index)
                .key_condition_expression("#partition = :owner")
                .expression_attribute_names("#partition", partition)
                .expression_attribute_values(":owner", s(key.clone()))
                .scan_index_forward(false)
                .limit((limit - jobs.len()) as i32)
                .set_exclusive_start_key(start.take());
            let mut filters = Vec::new();
            if let Some(status) = filter.status {
                filters.push("#status = :status");
                query = query
                    .expression_attribute_names("#status", "status")
                    .expression_attribute_values(":status", s(status.as_str()));
            }
            if let Some(job_type) = &filter.job_type {
                filters.push("#type = :type");
                query = query
                    .expression_attribute_names("#type", "type")
                    .expression_attribute_values(":type", s(job_type));
            }
            if !filters.is_empty() {
                query = query.filter_expression(filters.join(" AND "));
            }
            let page =
                query.send().await.map_err(|e| StoreError::from(AwsError::new("list jobs", e)))?;
            for item in page.items.unwrap_or_default() {
                jobs.push(from_item::<JobEntry>(item)?);
            }
            start = page.last_evaluated_key;
            if start.is_none() || jobs.len() >= limit {
                break;
            }
        }
        let next = start.map(|key| encode_cursor(owner, &key)).transpose()?;
        Ok((jobs, next))
    }
}

impl JobStore {
    /// How many of `owner`'s jobs have not yet run (pending or queued, never claimed), counted
    /// up to `at_most`: the backlog index's entries of the owner, keys only, page by page until
    /// the count reaches `at_most` (a tenant at a cap of 10,000 costs about one 1 MB page).
    pub async fn backlog(&self, owner: &Owner, at_most: usize) -> Result<usize, StoreError> {
        let mut counted = 0;
        let mut start = None;
        loop {
            let page = self
                .client
                .query()
                .table_name(&self.table)
                .index_name(BACKLOG_INDEX)
                .key_condition_expression("#backlog = :owner")
                .expression_attribute_names("#backlog", BACKLOG_INDEX_PK)
                .expression_attribute_values(":owner", s(owner_index_pk(owner)))
                .select(aws_sdk_dynamodb::types::Select::Count)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| AwsError::new("count a tenant's jobs not yet running", e))?;
            counted += page.count.max(0) as usize;
            start = page.last_evaluated_key;
            if counted >= at_most || start.is_none() {
                return Ok(counted);
            }
        }
    }
}

#[cfg(test)]
mod cursor_tests {
    use super::*;

    fn owner(name: &str) -> Owner {
        name.parse().unwrap()
    }

    fn position_key(owner: &Owner, job_id: &JobId) -> Item {
        HashMap::from([
            ("pk".to_owned(), s(job_pk(job_id))),
            ("sk".to_owned(), s(JOB_SK)),
            ("gsi1pk".to_owned(), s(owner_index_pk(owner))),
            ("gsi1sk".to_owned(), s(format!("2026-01-02T03:04:05.678Z#{job_id}"))),
        ])
    }

    #[test]
    fn a_cursor_is_the_start_key_it_was_made_from_in_the_callers_index_only() {
        let id = JobId::new();
        let key = position_key(&owner("alice"), &id);
        let cursor = encode_cursor(&owner("alice"), &key).unwrap();
        assert_eq!(decode_cursor(&owner("alice"), &cursor).unwrap(), key);
        assert!(matches!(decode_cursor(&owner("bob"), &cursor), Err(ListError::InvalidCursor)));
        // Whatever was in the key, the start key's partition is the caller's.
        let theirs = position_key(&owner("bob"), &id);
        let cursor = encode_cursor(&owner("alice"), &theirs).unwrap();
        assert_eq!(decode_cursor(&owner("alice"), &cursor).unwrap()["gsi1pk"], s("OWNER#alice"));
    }

    #[test]
    fn a_start_key_that_is_not_ours_is_corrupt_not_a_cursor() {
        let mut key = position_key(&owner("alice"), &JobId::new());
        key.insert("gsi1sk".into(), s("garbage"));
        assert!(matches!(encode_cursor(&owner("alice"), &key), Err(StoreError::Corrupt { .. })));
    }
}
