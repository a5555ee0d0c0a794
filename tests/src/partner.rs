//! A partner's webhook receiver on 127.0.0.1, shared by the tests of callbacks and endpoints:
//! `POST /{mode}/{key}` answers as `mode` says — `ok` 204, `gone` 410, `slow` 200 after 2 s,
//! anything else 500 — and keeps every request it got under `key` (one key per test case).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use serde_json::Value;

use crate::Deadline;

/// One request the receiver got, as sent.
#[derive(Debug, Clone)]
pub struct Received {
    /// Its headers.
    pub headers: HeaderMap,
    /// Its body.
    pub body: Vec<u8>,
}

impl Received {
    fn header(&self, name: &str) -> &str {
        self.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default()
    }

    /// `webhook-id`.
    pub fn id(&self) -> &str {
        self.header("webhook-id")
    }

    /// `webhook-timestamp` (0 if absent).
    pub fn timestamp(&self) -> i64 {
        self.header("webhook-timestamp").parse().unwrap_or(0)
    }

    /// `webhook-signature`.
    pub fn signature(&self) -> &str {
        self.header("webhook-signature")
    }

    /// The body as JSON.
    pub fn payload(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }
}

type Inbox = Arc<Mutex<BTreeMap<String, Vec<Received>>>>;

/// The receiver of this test binary (started on first use, on its own thread and runtime, so
/// it outlives any one test's runtime).
fn receiver() -> &'static (SocketAddr, Inbox) {
    static RECEIVER: OnceLock<(SocketAddr, Inbox)> = OnceLock::new();
    RECEIVER.get_or_init(|| {
        let inbox: Inbox = Default::default();
        let (tx, rx) = std::sync::mpsc::channel();
        let state = inbox.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async move {
                let listener =
                    tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a local port");
                tx.send(listener.local_addr().expect("its address")).expect("the caller waits");
                let app = axum::Router::new()
                    .route("/{mode}/{key}", axum::routing::post(receive))
                    .with_state(state);
                axum::serve(listener, app).await.expect("the receiver serves");
            });
        });
        (rx.recv().expect("the receiver starts"), inbox)
    })
}

async fn receive(
    State(inbox): State<Inbox>,
    Path((mode, key)): Path<(String, String)>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> StatusCode {
    let received = Received { headers, body: body.to_vec() };
    inbox.lock().expect("not poisoned").entry(key).or_default().push(received);
    match mode.as_str() {
        "ok" => StatusCode::NO_CONTENT,
        "gone" => StatusCode::GONE,
        "slow" => {
            tokio::time::sleep(Duration::from_secs(2)).await;
            StatusCode::OK
        }
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// A fresh URL of the receiver answering as `mode`, and the key its requests are kept under.
pub fn partner_url(mode: &str) -> (String, String) {
    let key = uuid::Uuid::new_v4().simple().to_string();
    (format!("http://{}/{mode}/{key}", receiver().0), key)
}

/// What the receiver got at `key` so far.
pub fn inbox(key: &str) -> Vec<Received> {
    receiver().1.lock().expect("not poisoned").get(key).cloned().unwrap_or_default()
}

/// What the receiver got at `key`, once `done` holds of it (or a failure naming `what`, after
/// `timeout`).
pub async fn received_until(
    key: &str,
    what: &str,
    timeout: Duration,
    done: impl Fn(&[Received]) -> bool,
) -> Vec<Received> {
    let deadline = Deadline::new(format!("{what} received at {key}"), timeout);
    loop {
        let got = inbox(key);
        if done(&got) {
            return got;
        }
        deadline.tick(Duration::from_millis(50), format!("{} requests", got.len())).await;
    }
}
