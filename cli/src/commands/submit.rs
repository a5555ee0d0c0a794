//! `submit`.

use reqwest::Method;
use serde_json::{Value, json};

use crate::api::Api;
use crate::cli::Submit;
use crate::error::{CliError, Exit};
use crate::output::Output;
use crate::params;

/// The `POST /jobs` body for `args` with its `params`.
pub fn body(args: &Submit, params: Value) -> Value {
    let mut body = json!({ "type": args.kind, "params": params });
    if let Some(priority) = args.priority {
        body["priority"] = priority.as_str().into();
    }
    body
}

/// Submits the job; prints its id (text) or the accepted job (JSON). With `--wait`, watches
/// it to its end instead and exits with the job's code.
pub async fn submit(api: &Api, out: &Output, args: &Submit) -> Result<Exit, CliError> {
    let body = body(args, params::load(&args.params)?);
    let reply = send_riding_out_in_flight(api, &body, args.idempotency_key.as_deref()).await?;
    let job_id = reply
        .body
        .get("job_id")
        .and_then(Value::as_str)
        .ok_or_else(|| CliError::Protocol("POST /jobs answered without a job_id".into()))?
        .to_owned();
    let replayed = reply.headers.get("idempotent-replayed").is_some_and(|v| v == "true");
    if replayed {
        out.note(&format!("job {job_id} already existed for this request (idempotent replay)"));
    }
    if args.wait {
        if !out.json {
            out.note(&format!("submitted job {job_id}"));
        }
        return super::watch(api, out, &job_id).await;
    }
    out.print(&reply.body, || job_id.clone());
    Ok(Exit::Ok)
}

/// How many times a submission answered "the original request is still in progress" (`409`
/// `request-in-flight`, e.g. a replay of a key whose job is being created) is sent again.
const IN_FLIGHT_RETRIES: u32 = 10;

/// `POST /jobs`, sent again (a second later, as the answer's `Retry-After` says) while the
/// API says the original request with this key is still in flight: the answer the caller
/// wants is that request's job, which comes within moments.
async fn send_riding_out_in_flight(
    api: &Api,
    body: &Value,
    key: Option<&str>,
) -> Result<crate::api::Reply, CliError> {
    let mut tries = 0;
    loop {
        let mut request = api.request(Method::POST, "/jobs").json(body);
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        match api.send(request, "POST /jobs").await {
            Err(CliError::Api(problem)) if is_in_flight(&problem) && tries < IN_FLIGHT_RETRIES => {
                tries += 1;
                // The API asks for a second (`Retry-After: 1`) whenever it answers this.
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
            other => return other,
        }
    }
}

/// Whether `problem` says the original request with this key is still being processed.
fn is_in_flight(problem: &crate::api::Problem) -> bool {
    problem.status == Some(409)
        && problem.kind.as_deref().is_some_and(|k| k.ends_with("/request-in-flight"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn parsed(args: &[&str]) -> Submit {
        match Cli::try_parse_from(args).unwrap().command {
            Command::Submit(submit) => submit,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn only_an_in_flight_conflict_is_sent_again() {
        let problem = |status, kind: &str| crate::api::Problem {
            status: Some(status),
            kind: Some(kind.to_owned()),
            ..Default::default()
        };
        assert!(is_in_flight(&problem(409, "/problems/request-in-flight")));
        assert!(!is_in_flight(&problem(409, "/problems/idempotency-key-reused")));
        assert!(!is_in_flight(&problem(422, "/problems/request-in-flight")));
    }

    #[test]
    fn the_body_carries_type_params_and_priority_when_given() {
        let args = parsed(&["longhaul", "submit", "demo", "--priority", "high"]);
        assert_eq!(
            body(&args, json!({"items": 1})),
            json!({"type": "demo", "params": {"items": 1}, "priority": "high"})
        );
        let args = parsed(&["longhaul", "submit", "demo"]);
        assert_eq!(body(&args, json!({})), json!({"type": "demo", "params": {}}));
    }
}
