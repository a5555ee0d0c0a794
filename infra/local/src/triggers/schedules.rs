//! EventBridge schedules: each `Schedule` event of the template fires its function at its
//! rate, and on demand through `POST /_local/schedules/{name}`.

use std::collections::HashMap;
use std::sync::Arc;

use lambda_runtime::Diagnostic;
use serde_json::{Value, json};

use crate::hosting::hosted::HostedFunction;
use crate::stack::model::EventSpec;

/// The stack's schedules by name.
#[derive(Clone, Default)]
pub struct Schedules(Arc<HashMap<String, HostedFunction>>);

impl Schedules {
    /// Every schedule of the hosted functions.
    pub fn new(functions: &[HostedFunction]) -> Self {
        let mut map = HashMap::new();
        for function in functions {
            for event in &function.spec.events {
                if let EventSpec::Schedule { name, .. } = event {
                    map.insert(name.clone(), function.clone());
                }
            }
        }
        Schedules(Arc::new(map))
    }

    /// Fires `name` now; `None` if there is no such schedule.
    pub async fn fire(&self, name: &str) -> Option<Result<Value, Diagnostic>> {
        let function = self.0.get(name)?;
        Some(function.invoke(scheduled_event(name)).await)
    }

    /// Runs every schedule with a rate until the task is aborted.
    pub fn spawn(&self) -> Vec<tokio::task::JoinHandle<()>> {
        let mut tasks = Vec::new();
        for (name, function) in self.0.iter() {
            let every = function.spec.events.iter().find_map(|e| match e {
                EventSpec::Schedule { name: n, every: Some(every) } if n == name => Some(*every),
                _ => None,
            });
            let Some(every) = every else { continue };
            let (name, schedules) = (name.clone(), self.clone());
            tasks.push(tokio::spawn(async move {
                let mut ticker =
                    tokio::time::interval_at(tokio::time::Instant::now() + every, every);
                loop {
                    ticker.tick().await;
                    if let Some(Err(diagnostic)) = schedules.fire(&name).await {
                        tracing::warn!(
                            schedule = name,
                            error_type = diagnostic.error_type,
                            "scheduled run failed"
                        );
                    }
                }
            }));
        }
        tasks
    }
}

/// The event EventBridge sends for a scheduled rule.
fn scheduled_event(name: &str) -> Value {
    json!({
        "version": "0",
        "id": uuid::Uuid::new_v4().to_string(),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": crate::stack::template::ACCOUNT,
        "time": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "region": crate::stack::template::REGION,
        "resources": [format!("arn:aws:events:{}:{}:rule/{name}", crate::stack::template::REGION, crate::stack::template::ACCOUNT)],
        "detail": {},
    })
}
