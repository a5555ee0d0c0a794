//! Deliveries ignore the proxy variables: a proxy would resolve the callback's host itself and
//! bypass the checked, pinned address.
//!
//! This binary holds this one test because it sets process-wide environment variables; no
//! other test shares its process.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A listener that counts the connections it accepts and answers each with `status`.
async fn listener(status: &'static str) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else { return };
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                // One read is enough for these small requests; then answer and close.
                let mut buffer = vec![0; 8192];
                if socket.read(&mut buffer).await.is_ok() {
                    let answer = format!(
                        "HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                    );
                    // The client may already have given up (a TLS hello got plain HTTP back).
                    socket.write_all(answer.as_bytes()).await.ok();
                }
            });
        }
    });
    (address, accepted)
}

#[tokio::test]
async fn deliveries_never_go_through_a_proxy_from_the_environment() {
    let (receiver, received) = listener("204 No Content").await;
    let (proxy, proxied) = listener("502 Bad Gateway").await;
    let proxy_url = format!("http://{proxy}");
    // SAFETY: this is the only test of this binary and it sets the variables before any
    // other thread of its own could read the environment.
    unsafe {
        for name in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"] {
            std::env::set_var(name, &proxy_url);
        }
        for name in ["NO_PROXY", "no_proxy"] {
            std::env::remove_var(name);
        }
    }
    let tls = webhook::tls_config().unwrap();
    let host = "partner.example.com";
    let client = webhook::delivery_client(host, receiver, Duration::from_secs(5), tls).unwrap();

    // Plain http (the local stack's insecure mode): goes straight to the pinned receiver.
    let url = format!("http://{host}:{}/hook", receiver.port());
    let answer = client.post(url).body("{}").send().await.unwrap();
    assert_eq!(answer.status(), 204, "the pinned receiver answered, not the proxy");
    assert_eq!(received.load(Ordering::SeqCst), 1);

    // https: no CONNECT to the proxy either; the pinned address is contacted (and, not being
    // a TLS server, fails the handshake).
    let url = format!("https://{host}:{}/hook", receiver.port());
    let failed = client.post(url).body("{}").send().await;
    assert!(failed.is_err(), "the receiver speaks no TLS: {failed:?}");
    assert_eq!(received.load(Ordering::SeqCst), 2, "the https attempt went to the receiver");

    assert_eq!(proxied.load(Ordering::SeqCst), 0, "the proxy was never contacted");
}
