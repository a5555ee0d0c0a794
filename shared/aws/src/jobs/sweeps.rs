//! What the reaper and the expirer read: pages of the status index, their cursors, and pages
//! of a count of a bucket.

use super::*;

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use crate::AwsError;

/// One page of a status-index bucket (see [`JobStore::due_page`]).
#[derive(Debug, Default)]
pub struct DuePage {
    /// The page's job records, oldest first.
    pub items: Vec<Item>,
    /// Where the next page starts; `None` once the shard is done.
    pub next: Option<Item>,
}

/// The key of the item that remembers where unfinished sweeps of the status-index buckets
/// stopped (`SWEEP` / `CURSORS`, one attribute per bucket shard).
pub(super) fn sweep_key() -> Item {
    HashMap::from([("pk".to_owned(), s("SWEEP")), ("sk".to_owned(), s("CURSORS"))])
}

/// The name under which the sweep of bucket `kind`, shard `shard`, keeps its cursor.
pub fn sweep_name(kind: &str, shard: u32) -> String {
    format!("{kind}#{shard}")
}

impl JobStore {
    /// One page of status-index bucket `kind`, shard `shard`: up to `limit` entries whose sort
    /// key is before `before`, oldest first, starting after `start` (the previous page's
    /// [`DuePage::next`]). Sweeps that must see every entry, whatever their number, page with it.
    pub async fn due_page(
        &self,
        kind: &str,
        shard: u32,
        before: &str,
        limit: usize,
        start: Option<Item>,
    ) -> Result<DuePage, StoreError> {
        let page = self
            .bucket_query(kind, shard, "AND gsi2sk < :before")
            .expression_attribute_values(":before", s(before))
            .limit(limit.clamp(1, i32::MAX as usize) as i32)
            .set_exclusive_start_key(start)
            .send()
            .await
            .map_err(|e| AwsError::new(format!("query the {kind} index (shard {shard})"), e))?;
        Ok(DuePage { items: page.items.unwrap_or_default(), next: page.last_evaluated_key })
    }

    /// Where the last unfinished sweeps of the status-index buckets stopped, by
    /// [`sweep_name`] (a bucket's shard missing from it starts from its oldest entry): one
    /// read per run for every sweep. See [`JobStore::save_sweep_cursor`].
    pub async fn sweep_cursors(&self) -> Result<HashMap<String, Item>, StoreError> {
        let output = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(sweep_key()))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| AwsError::new("read the sweep cursors", e))?;
        Ok(output
            .item
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(name, value)| Some((name, value.as_m().ok()?.clone())))
            .collect())
    }

    /// Records where the sweep named `name` ([`sweep_name`]) stopped (`Some`: the next run
    /// starts there) or that it reached the end (`None`: the next run starts from the oldest).
    pub async fn save_sweep_cursor(
        &self,
        name: &str,
        start: Option<Item>,
    ) -> Result<(), StoreError> {
        let update = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(sweep_key()))
            .expression_attribute_names("#sweep", name);
        let update = match start {
            Some(start) => update
                .update_expression("SET #sweep = :start")
                .expression_attribute_values(":start", AttributeValue::M(start)),
            None => update.update_expression("REMOVE #sweep"),
        };
        update
            .send()
            .await
            .map_err(|e| AwsError::new(format!("save the {name} sweep cursor"), e))?;
        Ok(())
    }

    /// One page of a count of status-index bucket `kind`, shard `shard`: how many entries
    /// follow `start` (the previous page's next key), up to `limit`, and the key the next page
    /// starts after (`None` once the shard is counted). One `Select=COUNT` query, so only the
    /// count crosses the wire; it is billed by the index data it read, as any query, so a
    /// caller that must stay bounded caps the pages it reads (see the reaper's counts).
    pub async fn count_page(
        &self,
        kind: &str,
        shard: u32,
        limit: usize,
        start: Option<Item>,
    ) -> Result<(u64, Option<Item>), StoreError> {
        let page = self
            .bucket_query(kind, shard, "")
            .select(aws_sdk_dynamodb::types::Select::Count)
            .limit(limit.clamp(1, i32::MAX as usize) as i32)
            .set_exclusive_start_key(start)
            .send()
            .await
            .map_err(|e| AwsError::new(format!("count the {kind} index (shard {shard})"), e))?;
        Ok((page.count.max(0) as u64, page.last_evaluated_key))
    }

    /// A Query of status-index bucket `kind`, shard `shard` (`gsi2pk = :bucket`, then
    /// `sort_condition` on `gsi2sk`, whose values the caller adds).
    pub(super) fn bucket_query(
        &self,
        kind: &str,
        shard: u32,
        sort_condition: &str,
    ) -> aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder {
        self.client
            .query()
            .table_name(&self.table)
            .index_name(STATUS_INDEX)
            .key_condition_expression(
                format!("gsi2pk = :bucket {sort_condition}").trim_end().to_owned(),
            )
            .expression_attribute_values(":bucket", s(format!("{kind}#{shard}")))
    }
}
