//! An API error as the client reads it: an RFC 9457 problem (`application/problem+json`), or as
//! close as a gateway's answer allows.

use std::fmt;

use reqwest::StatusCode;
use serde::Deserialize;
use serde_json::{Map, Value};

/// An API error as RFC 9457 describes it (`application/problem+json`), or as close as the
/// answer allows: a gateway's `{"message": …}` becomes the title, anything else the status's
/// reason phrase. The body is never shown raw.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Problem {
    /// The problem type (`/problems/<slug>`).
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// Short summary.
    pub title: Option<String>,
    /// HTTP status.
    pub status: Option<u16>,
    /// What happened in this case.
    pub detail: Option<String>,
    /// Extension members (`status_now`, `errors`…).
    #[serde(flatten)]
    pub extensions: Map<String, Value>,
}

impl Problem {
    /// The problem an error answer with `status`, `content_type` and `body` describes.
    pub fn from_answer(status: u16, content_type: Option<&str>, body: &[u8]) -> Problem {
        let is_problem = content_type.is_some_and(|c| c.starts_with("application/problem+json"));
        let parsed: Option<Value> = serde_json::from_slice(body).ok();
        let mut problem = match parsed {
            Some(value) if is_problem => serde_json::from_value(value).unwrap_or_default(),
            Some(Value::Object(object)) => {
                let message = object.get("message").and_then(Value::as_str);
                Problem { title: message.map(str::to_owned), ..Problem::default() }
            }
            _ => Problem::default(),
        };
        problem.status = Some(status);
        if problem.title.is_none() {
            let reason = StatusCode::from_u16(status).ok().and_then(|s| s.canonical_reason());
            problem.title = Some(reason.unwrap_or("Error").to_owned());
        }
        problem
    }

    /// The HTTP status (0 if unknown).
    pub fn status(&self) -> u16 {
        self.status.unwrap_or(0)
    }

    /// The problem as one JSON object (for `--json`).
    pub fn to_json(&self) -> Value {
        let mut object = self.extensions.clone();
        for (name, value) in [
            ("type", self.kind.clone().map(Value::from)),
            ("title", self.title.clone().map(Value::from)),
            ("status", self.status.map(Value::from)),
            ("detail", self.detail.clone().map(Value::from)),
        ] {
            if let Some(value) = value {
                object.insert(name.into(), value);
            }
        }
        Value::Object(object)
    }

    /// A hint for what to do about it, when there is an obvious one.
    pub fn hint(&self) -> Option<&'static str> {
        match self.status() {
            401 => Some("check LONGHAUL_TOKEN / --token: it is missing, invalid or expired"),
            403 => Some("the token is valid but not allowed to do this"),
            410 => Some("the result is gone: it passed its retention and was deleted"),
            429 => Some("too many requests: wait and try again"),
            _ => None,
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (HTTP {})", self.title.as_deref().unwrap_or("Error"), self.status())?;
        if let Some(detail) = self.detail.as_deref().filter(|d| !d.is_empty()) {
            write!(f, ": {detail}")?;
        }
        if let Some(now) = self.extensions.get("status_now").and_then(Value::as_str) {
            write!(f, " [job is {now}]")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_problem_renders_its_title_status_and_detail() {
        let body = br#"{"type":"/problems/wrong-status","title":"The job is not in a state that allows this","status":409,"detail":"the job has not succeeded yet","status_now":"running"}"#;
        let problem = Problem::from_answer(409, Some("application/problem+json"), body);
        assert_eq!(
            problem.to_string(),
            "The job is not in a state that allows this (HTTP 409): the job has not succeeded \
             yet [job is running]"
        );
        assert_eq!(problem.to_json()["type"], "/problems/wrong-status");
        assert_eq!(problem.to_json()["status_now"], "running");
    }

    #[test]
    fn a_gateway_message_becomes_the_title() {
        let problem =
            Problem::from_answer(401, Some("application/json"), br#"{"message":"Unauthorized"}"#);
        assert_eq!(problem.to_string(), "Unauthorized (HTTP 401)");
        assert!(problem.hint().unwrap().contains("LONGHAUL_TOKEN"));
    }

    #[test]
    fn an_unreadable_body_is_never_shown_raw() {
        let problem = Problem::from_answer(502, Some("text/html"), b"<html>secret stack</html>");
        assert_eq!(problem.to_string(), "Bad Gateway (HTTP 502)");
        let problem = Problem::from_answer(500, Some("application/problem+json"), b"[1]");
        assert_eq!(problem.to_string(), "Internal Server Error (HTTP 500)");
    }
}
