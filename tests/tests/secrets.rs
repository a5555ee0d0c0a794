//! Webhook signing secrets against the local stack: rotations are conditional writes (two at
//! once never lose a secret that was handed out) and at most two secrets are ever active.

use std::collections::HashMap;

use longhaul_aws::jobs::{JobStore, MAX_ACTIVE_SECRETS, Rotation};
use longhaul_domain::webhooks::ExposeSecret;
use longhaul_tests::{Api, Reply, harness, principal};
use serde_json::json;

/// The secrets an answer of `GET /webhooks/secret` or of a rotation lists, newest first.
fn listed(reply: &Reply) -> Vec<String> {
    assert_eq!(reply.status, 200, "{}", reply.text);
    reply.json["secrets"]
        .as_array()
        .expect("a list of secrets")
        .iter()
        .map(|s| s["secret"].as_str().expect("a secret").to_owned())
        .collect()
}

/// The job table, as the administrator.
async fn store() -> JobStore {
    let sdk = harness().stack.emulator_sdk_config().await;
    JobStore::new(aws_sdk_dynamodb::Client::new(&sdk), harness().stack.resource("JobsTable"))
}

/// Two rotations at once, several times over: each is answered 200 (it was stored) or 409
/// (another won; problem+json). The 200s form one chain — each one's previous secret is the
/// secret the one before it made — so no rotation overwrote another unseen (a lost secret
/// would show as two rotations with the same previous secret), and the record ends as the
/// chain's last two links.
#[tokio::test]
async fn concurrent_rotations_lose_no_secret() {
    harness();
    let api = Api::new(&principal("racing-rotations"));
    let mut newest = listed(&api.get("/webhooks/secret").await).remove(0);
    let (mut conflicts, mut stored) = (0, 0);
    for _ in 0..5 {
        let empty = json!({});
        let (a, b) = tokio::join!(
            api.post_json("/webhooks/secret/rotate", &empty),
            api.post_json("/webhooks/secret/rotate", &empty)
        );
        // Successful rotations, by the secret they replaced as the newest.
        let mut by_previous: HashMap<String, String> = HashMap::new();
        for reply in [&a, &b] {
            if reply.status == 409 {
                conflicts += 1;
                assert_eq!(reply.header("content-type"), Some("application/problem+json"));
                assert_eq!(reply.json["type"], "/problems/rotation-conflict", "{}", reply.text);
                assert!(!reply.text.contains("whsec_"), "a refused rotation hands out nothing");
                continue;
            }
            stored += 1;
            let secrets = listed(reply);
            assert_eq!(secrets.len(), 2, "the new secret and the one it replaces");
            let replaced = by_previous.insert(secrets[1].clone(), secrets[0].clone());
            assert!(replaced.is_none(), "two rotations replaced the same secret: one was lost");
        }
        assert!(!by_previous.is_empty(), "one of two rotations always wins");
        // Follow the chain from the newest secret before the round.
        let mut chain = vec![newest.clone()];
        while let Some(next) = by_previous.remove(chain.last().expect("not empty")) {
            chain.push(next);
        }
        assert!(by_previous.is_empty(), "every stored rotation follows from the one before");
        let now = listed(&api.get("/webhooks/secret").await);
        assert_eq!(now, [chain[chain.len() - 1].clone(), chain[chain.len() - 2].clone()]);
        newest = now[0].clone();
    }
    eprintln!("10 rotations in pairs: {stored} stored, {conflicts} refused (409)");
}

/// The race, made certain: a rotation written from a read that another rotation has since
/// overtaken is refused, and the record keeps the winner's secret (what the 409 reports).
#[tokio::test]
async fn a_rotation_from_a_stale_read_is_refused_and_the_winner_kept() {
    harness();
    let owner = principal("stale-rotation");
    let jobs = store().await;
    let read = jobs.webhook_secrets(&owner).await.unwrap();
    let until: longhaul_domain::Timestamp = "2999-01-01T00:00:00Z".parse().unwrap();
    let Rotation::Rotated(winner) =
        jobs.rotate_webhook_secret_from(&owner, &read, until).await.unwrap()
    else {
        panic!("the first rotation from a fresh read is stored");
    };
    let Rotation::Lost(current) =
        jobs.rotate_webhook_secret_from(&owner, &read, until).await.unwrap()
    else {
        panic!("a rotation from the same, now stale, read must be refused");
    };
    let secrets = |record: &longhaul_aws::jobs::SecretsRecord| -> Vec<String> {
        record.secrets.iter().map(|s| s.secret.expose_secret().to_owned()).collect()
    };
    assert_eq!(secrets(&current), secrets(&winner), "the loser is told the winner's record");
    assert_eq!(secrets(&jobs.webhook_secrets(&owner).await.unwrap()), secrets(&winner));
    assert_eq!(current.version, read.version + 1);
}

/// Three rotations within a day: never more than two active secrets; the oldest is retired
/// (it neither signs nor is listed), the previous one overlaps with the newest.
#[tokio::test]
async fn at_most_two_secrets_are_active() {
    harness();
    let owner = principal("thrice-rotating");
    let api = Api::new(&owner);
    let mut seen = listed(&api.get("/webhooks/secret").await);
    for _ in 0..3 {
        let rotated = listed(&api.post_json("/webhooks/secret/rotate", &json!({})).await);
        assert_eq!(rotated.len(), MAX_ACTIVE_SECRETS, "{rotated:?}");
        assert_eq!(rotated[1], seen[0], "the previous newest keeps signing");
        seen = rotated;
    }
    assert_eq!(listed(&api.get("/webhooks/secret").await), seen);
    let stored = store().await.webhook_secrets(&owner).await.unwrap();
    assert_eq!(stored.secrets.len(), MAX_ACTIVE_SECRETS, "retired secrets are not kept");
}
