//! The local stack's fault plan, installed and cleared by a test.

use super::*;

/// The local stack's fault plan (`/_local/faults`): one for the whole stack, so tests that
/// install one take turns.
pub struct Faults {
    url: String,
    http: reqwest::Client,
}

impl Faults {
    /// Installs `plan` (its counts start at zero).
    pub async fn install(plan: &Value) -> Self {
        let faults = Faults {
            url: format!("{}/_local/faults", harness().stack.api_url),
            http: reqwest::Client::new(),
        };
        faults.set(plan).await;
        faults
    }

    async fn set(&self, plan: &Value) {
        let reply = self.http.post(&self.url).json(plan).send().await.expect("the faults endpoint");
        assert_eq!(reply.status(), 200, "installing {plan}: {:?}", reply.text().await);
    }

    /// What the plan injected so far: `{"plan": …, "injected": {counts}}`.
    pub async fn injected(&self) -> Value {
        let reply = self.http.get(&self.url).send().await.expect("the faults endpoint");
        reply.json().await.expect("the fault counts are JSON")
    }

    /// Turns faults off; answers what the plan had injected.
    pub async fn clear(self) -> Value {
        let injected = self.injected().await;
        self.set(&json!({})).await;
        injected
    }

    /// Waits until the plan has paused an invocation (`injected.paused` ≥ 1) while the job
    /// `job_id` of `api` goes on; panics if the job ends first (it ran on without its pause),
    /// or once nothing about it moved for a minute. Answers the counts.
    pub async fn wait_paused(&self, api: &Api, job_id: &JobId) -> Value {
        let mut watch = Movement::new(Duration::from_secs(60));
        loop {
            let injected = self.injected().await;
            if injected["injected"]["paused"].as_u64().unwrap_or(0) >= 1 {
                return injected;
            }
            let job = api.get(&format!("/jobs/{job_id}")).await.json;
            assert!(
                matches!(job["status"].as_str(), Some("pending" | "queued" | "running")),
                "the job ran on without its pause: {job} {injected}"
            );
            assert!(
                watch.still_moving(&job),
                "job {job_id}: no pause, nothing moved for {:?}: {job} {injected}",
                watch.limit
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
