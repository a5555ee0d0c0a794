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
    let mut request = api.request(Method::POST, "/jobs").json(&body);
    if let Some(key) = &args.idempotency_key {
        request = request.header("idempotency-key", key);
    }
    // Sent once. A replay of a key whose job exists answers 200 with that job at once; the
    // API answers 409 only while another request with this key has claimed it and not yet
    // written its job (a concurrent submission, or one that died less than 10 s ago), which
    // this command reports rather than waits out.
    let reply = api.send(request, "POST /jobs").await?;
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
