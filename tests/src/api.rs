//! The API client: one principal's requests, and waits that watch a job's movement.

use super::*;

/// A unique principal, so tests never see each other's jobs.
pub fn principal(label: &str) -> Owner {
    format!("{label}-{}", uuid::Uuid::new_v4().simple()).parse().expect("a test's principal")
}

/// An API client acting as one principal.
pub struct Api {
    /// Base URL.
    pub base: String,
    /// Bearer token (`None`: anonymous).
    pub token: Option<String>,
    http: reqwest::Client,
}

/// A response, read whole.
#[derive(Debug)]
pub struct Reply {
    /// Status code.
    pub status: u16,
    /// Headers.
    pub headers: reqwest::header::HeaderMap,
    /// Body parsed as JSON (`Null` if empty or not JSON).
    pub json: Value,
    /// Raw body.
    pub text: String,
}

impl Reply {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

impl Api {
    /// A client that does not follow redirects (so tests see the 303 itself).
    fn client() -> reqwest::Client {
        reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("client")
    }

    /// A client for `principal`.
    pub fn new(principal: &str) -> Self {
        let h = harness();
        Api {
            base: h.stack.api_url.clone(),
            token: Some(h.stack.token(principal)),
            http: Self::client(),
        }
    }

    /// A client without a token.
    pub fn anonymous() -> Self {
        Api { base: harness().stack.api_url.clone(), token: None, http: Self::client() }
    }

    /// Sends a request with optional raw body and extra headers.
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<(&str, Vec<u8>)>,
        headers: &[(&str, &str)],
    ) -> Reply {
        let mut request =
            self.http.request(method.parse().expect("method"), format!("{}{path}", self.base));
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some((content_type, bytes)) = body {
            request = request.header("content-type", content_type).body(bytes);
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request.send().await.expect("request reaches the local API");
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let text = response.text().await.expect("body");
        let json = serde_json::from_str(&text).unwrap_or(Value::Null);
        let reply = Reply { status, headers, json, text };
        if !path.starts_with("/_local/") {
            openapi::check(method, path, &reply);
        }
        assert_no_access_denied();
        reply
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> Reply {
        self.send("GET", path, None, &[]).await
    }

    /// `POST path` with a JSON body.
    pub async fn post_json(&self, path: &str, body: &Value) -> Reply {
        self.send("POST", path, Some(("application/json", body.to_string().into_bytes())), &[])
            .await
    }

    /// Submits a job and returns its id (asserting 202).
    pub async fn submit(&self, body: &Value) -> JobId {
        let reply = self.post_json("/jobs", body).await;
        assert_eq!(reply.status, 202, "submit: {}", reply.text);
        reply.json["job_id"].as_str().expect("job_id").parse().expect("a job id")
    }

    /// `POST /jobs` with `body` and the `Idempotency-Key` `key`; the reply as it is (no status
    /// asserted: refusals and replays are what some tests look at).
    pub async fn submit_with_key(&self, body: &Value, key: &str) -> Reply {
        let json = ("application/json", body.to_string().into_bytes());
        self.send("POST", "/jobs", Some(json), &[("idempotency-key", key)]).await
    }

    /// Uploads `bytes` through `POST /uploads` and returns the `input` reference.
    pub async fn upload(&self, filename: &str, content_type: &str, bytes: Vec<u8>) -> String {
        let body = serde_json::json!({"filename": filename, "content_type": content_type, "size_bytes": bytes.len()});
        let reply = self.post_json("/uploads", &body).await;
        assert_eq!(reply.status, 201, "{}", reply.text);
        let mut put = reqwest::Client::new()
            .put(reply.json["upload_url"].as_str().expect("upload_url"))
            .body(bytes);
        for (name, value) in reply.json["headers"].as_object().expect("headers") {
            put = put.header(name, value.as_str().expect("header value"));
        }
        let response = put.send().await.expect("upload");
        assert_eq!(response.status(), 200, "upload failed");
        reply.json["input"].as_str().expect("input").to_owned()
    }

    /// Downloads a succeeded job's result through `GET /jobs/{id}/result`: its `303` to S3 (a
    /// presigned URL) or to the API's own link of a small result, fetched without the token.
    pub async fn result(&self, job_id: &JobId) -> Vec<u8> {
        let download = reqwest::get(self.result_link(job_id).await).await.expect("download");
        assert_eq!(download.status(), 200);
        download.bytes().await.expect("body").to_vec()
    }

    /// The link `GET /jobs/{id}/result` redirects to, resolved against the request's URL as a
    /// client does (a small result's link is relative to it).
    pub async fn result_link(&self, job_id: &JobId) -> String {
        let path = format!("/jobs/{job_id}/result");
        let reply = self.get(&path).await;
        assert_eq!(reply.status, 303, "{}", reply.text);
        let location = reply.header("location").expect("Location");
        let request = reqwest::Url::parse(&format!("{}{path}", self.base)).expect("a URL");
        request.join(location).expect("a URL or a relative reference").to_string()
    }

    /// Polls `GET /jobs/{id}` until `pred` holds for the job's JSON (or panics, naming `what`
    /// it waited for, once nothing about the job has moved for a minute); returns that JSON.
    pub async fn wait_for(
        &self,
        job_id: &JobId,
        what: &str,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        let mut watch = Movement::new(Duration::from_secs(60));
        loop {
            let job = self.get(&format!("/jobs/{job_id}")).await.json;
            if pred(&job) {
                return job;
            }
            assert!(
                watch.still_moving(&job),
                "job {job_id}: waiting for {what}, nothing moved for {:?}: {job}",
                watch.limit
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Polls the job until it is terminal; panics once nothing about it has moved (status,
    /// attempt, progress, transitions) for `still_for`. A job that keeps working is waited
    /// for however slow the machine is; one that is stuck fails the test.
    pub async fn wait_terminal(&self, job_id: &JobId, still_for: Duration) -> Value {
        let mut watch = Movement::new(still_for);
        loop {
            let reply = self.get(&format!("/jobs/{job_id}")).await;
            assert_eq!(reply.status, 200, "{}", reply.text);
            if matches!(
                reply.json["status"].as_str(),
                Some("succeeded" | "failed" | "cancelled" | "expired")
            ) {
                return reply.json;
            }
            assert!(
                watch.still_moving(&reply.json),
                "job {job_id} not terminal, nothing moved for {still_for:?}: {}",
                reply.json
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Watches a job's view for movement: its status, attempt, progress and transitions. The
/// waits above give up only when none of these changed for `limit`, so a test's outcome does
/// not depend on how fast the machine works through the job.
pub(crate) struct Movement {
    pub(crate) limit: Duration,
    last: Option<Value>,
    since: tokio::time::Instant,
}

impl Movement {
    pub(crate) fn new(limit: Duration) -> Self {
        Movement { limit, last: None, since: tokio::time::Instant::now() }
    }

    /// Records `job`'s view; whether it moved within the last `limit`.
    pub(crate) fn still_moving(&mut self, job: &Value) -> bool {
        let seen = json!([
            job["status"],
            job["attempt"],
            job["progress"]["items_done"],
            job["progress"]["pct"],
            job["progress"]["stage_index"],
            job["transitions"].as_array().map(Vec::len),
        ]);
        if self.last.as_ref() != Some(&seen) {
            self.last = Some(seen);
            self.since = tokio::time::Instant::now();
        }
        self.since.elapsed() < self.limit
    }
}
