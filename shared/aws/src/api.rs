//! HTTP API helpers shared by the API functions: RFC 9457 problem responses, JSON bodies,
//! and the caller's identity from the JWT authorizer's claims.

use lambda_http::aws_lambda_events::apigw::ApiGatewayV2httpRequestContext;
use lambda_http::http::{HeaderValue, StatusCode, header};
use lambda_http::request::RequestContext;
use lambda_http::{Body, Request, RequestExt, Response};
use longhaul_domain::Owner;
use serde::Serialize;

/// The media type of every error response.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// An RFC 9457 problem: what went wrong, in a shape clients can branch on (`type`) and
/// people can read (`title`, `detail`).
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable slug; the `type` member is `/problems/<slug>`.
    pub slug: &'static str,
    /// Short, fixed summary of the problem type.
    pub title: &'static str,
    /// This occurrence, in words written for the client: about their request, never an error
    /// chain, a bucket, a table or an ARN (an AWS failure is logged with the job id and
    /// answered with [`Problem::internal`]).
    pub detail: String,
    /// Extension members.
    pub extensions: serde_json::Map<String, serde_json::Value>,
    /// Extra response headers (e.g. `Retry-After`).
    pub headers: Vec<(header::HeaderName, String)>,
}

impl Problem {
    /// A problem of type `/problems/<slug>`.
    pub fn new(
        status: StatusCode,
        slug: &'static str,
        title: &'static str,
        detail: impl Into<String>,
    ) -> Self {
        Problem {
            status,
            slug,
            title,
            detail: detail.into(),
            extensions: Default::default(),
            headers: Vec::new(),
        }
    }

    /// 400: the request could not be read.
    pub fn bad_request(detail: impl Into<String>) -> Self {
        Problem::new(StatusCode::BAD_REQUEST, "bad-request", "The request is malformed", detail)
    }

    /// 404: no such resource *for this caller* (another tenant's job reads the same).
    pub fn not_found() -> Self {
        Problem::new(StatusCode::NOT_FOUND, "not-found", "Not found", "There is no such resource.")
    }

    /// 413: the body is over the limit.
    pub fn too_large(limit: usize) -> Self {
        Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload-too-large",
            "The request body is too large",
            format!("The body must be at most {limit} bytes."),
        )
    }

    /// 415: not a JSON body.
    pub fn unsupported_media_type() -> Self {
        Problem::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported-media-type",
            "Unsupported media type",
            "Send the body as application/json.",
        )
    }

    /// 422: well-formed but not acceptable.
    pub fn unprocessable(
        slug: &'static str,
        title: &'static str,
        detail: impl Into<String>,
    ) -> Self {
        Problem::new(StatusCode::UNPROCESSABLE_ENTITY, slug, title, detail)
    }

    /// 401: no caller identity (the authorizer should have refused already).
    pub fn unauthorized() -> Self {
        Problem::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "Unauthorized",
            "A valid bearer token is required.",
        )
    }

    /// 500: our fault. The detail never carries internals; they go to the log.
    pub fn internal() -> Self {
        Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "Internal error",
            "The request could not be completed. It is safe to retry with the same Idempotency-Key.",
        )
    }

    /// Adds an extension member.
    pub fn with(mut self, name: &str, value: impl Serialize) -> Self {
        self.extensions.insert(name.to_owned(), serde_json::to_value(value).unwrap_or_default());
        self
    }

    /// Adds a response header.
    pub fn header(mut self, name: header::HeaderName, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    /// The `application/problem+json` response.
    pub fn into_response(self) -> Response<Body> {
        let mut body = serde_json::Map::new();
        body.insert("type".into(), format!("/problems/{}", self.slug).into());
        body.insert("title".into(), self.title.into());
        body.insert("status".into(), self.status.as_u16().into());
        body.insert("detail".into(), self.detail.into());
        body.extend(self.extensions);
        let mut response = json_response(self.status, &body);
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        for (name, value) in self.headers {
            if let Ok(value) = HeaderValue::from_str(&value) {
                response.headers_mut().insert(name, value);
            }
        }
        response
    }
}

/// A JSON response.
pub fn json_response(status: StatusCode, body: &impl Serialize) -> Response<Body> {
    let bytes = serde_json::to_vec(body).expect("response bodies always serialise");
    let mut response = Response::new(Body::Binary(bytes));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// The authenticated caller: the JWT `sub` claim (or `client_id` for machine clients without
/// a subject), as put in the request context by API Gateway's JWT authorizer. `None` when
/// there is none, or when it is not an [`Owner`] (empty, too long, control characters): such a
/// request is answered as one without a caller, never served under a default owner.
pub fn principal(request: &Request) -> Option<Owner> {
    let RequestContext::ApiGatewayV2(ApiGatewayV2httpRequestContext {
        authorizer: Some(authorizer),
        ..
    }) = request.request_context()
    else {
        return None;
    };
    let claims = authorizer.jwt?.claims;
    claims.get("sub").or_else(|| claims.get("client_id"))?.parse().ok()
}

/// The API Gateway route that matched (`"GET /jobs/{id}"`), which is how a function serving
/// several routes dispatches.
pub fn route_key(request: &Request) -> Option<String> {
    match request.request_context() {
        RequestContext::ApiGatewayV2(context) => context.route_key,
        _ => None,
    }
}

/// The job id in the path (`{id}`); anything that is not a canonical job id reads as an
/// unknown job.
pub fn path_job_id(request: &Request) -> Result<longhaul_domain::JobId, Problem> {
    request
        .path_parameters()
        .first("id")
        .and_then(|id| id.parse().ok())
        .ok_or_else(Problem::not_found)
}

/// 409 naming the job's current status (`status_now`).
pub fn wrong_status(status: longhaul_domain::JobStatus, detail: impl Into<String>) -> Problem {
    Problem::new(
        StatusCode::CONFLICT,
        "wrong-status",
        "The job is not in a state that allows this",
        detail,
    )
    .with("status_now", status)
}

/// The request body as JSON, enforcing a JSON media type and a size limit.
pub fn json_body(request: &Request, max_bytes: usize) -> Result<serde_json::Value, Problem> {
    let is_json = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|mime| {
            let mime = mime.trim().to_ascii_lowercase();
            mime == "application/json"
                || (mime.starts_with("application/") && mime.ends_with("+json"))
        })
        .unwrap_or(false);
    if !is_json {
        return Err(Problem::unsupported_media_type());
    }
    let bytes: &[u8] = request.body().as_ref();
    if bytes.len() > max_bytes {
        return Err(Problem::too_large(max_bytes));
    }
    // serde_json refuses nesting deeper than 128 levels with an error, never a stack overflow.
    serde_json::from_slice(bytes)
        .map_err(|e| Problem::bad_request(format!("The body is not valid JSON: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problem_shape() {
        let response = Problem::not_found().with("job_id", "x").into_response();
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        assert_eq!(response.headers()[header::CONTENT_TYPE], PROBLEM_JSON);
        let body: serde_json::Value = serde_json::from_slice(response.body().as_ref()).unwrap();
        assert_eq!(body["type"], "/problems/not-found");
        assert_eq!(body["status"], 404);
        assert_eq!(body["job_id"], "x");
    }

    #[test]
    fn the_principal_is_an_owner_or_no_caller_at_all() {
        use lambda_http::aws_lambda_events::apigw::{
            ApiGatewayRequestAuthorizer, ApiGatewayRequestAuthorizerJwtDescription,
        };
        let request = |claims: &[(&str, &str)]| {
            let mut jwt = ApiGatewayRequestAuthorizerJwtDescription::default();
            for (name, value) in claims {
                jwt.claims.insert((*name).to_owned(), (*value).to_owned());
            }
            let mut authorizer = ApiGatewayRequestAuthorizer::default();
            authorizer.jwt = Some(jwt);
            let mut context = ApiGatewayV2httpRequestContext::default();
            context.authorizer = Some(authorizer);
            lambda_http::http::Request::builder()
                .body(Body::Empty)
                .unwrap()
                .with_request_context(RequestContext::ApiGatewayV2(context))
        };
        let alice = principal(&request(&[("sub", "auth0|alice")])).unwrap();
        assert_eq!(alice.as_str(), "auth0|alice");
        assert_eq!(principal(&request(&[("client_id", "svc")])).unwrap().as_str(), "svc");
        assert_eq!(principal(&request(&[])), None);
        let too_long = "a".repeat(Owner::MAX_BYTES + 1);
        for bad in ["", "a\nb", "\0", too_long.as_str()] {
            assert_eq!(principal(&request(&[("sub", bad)])), None, "{bad:?}");
        }
        // An empty subject is no caller, even beside a client id (as before owners were typed).
        assert_eq!(principal(&request(&[("sub", ""), ("client_id", "svc")])), None);
        let no_authorizer = lambda_http::http::Request::builder()
            .body(Body::Empty)
            .unwrap()
            .with_request_context(RequestContext::ApiGatewayV2(Default::default()));
        assert_eq!(principal(&no_authorizer), None);
    }

    #[test]
    fn bodies_need_json_and_a_size_limit() {
        let request = |ct: &str, body: &str| {
            lambda_http::http::Request::builder()
                .header("content-type", ct)
                .body(Body::from(body))
                .unwrap()
        };
        assert!(json_body(&request("application/json; charset=utf-8", "{}"), 10).is_ok());
        assert_eq!(json_body(&request("text/plain", "{}"), 10).unwrap_err().status, 415);
        assert_eq!(
            json_body(&request("application/json", "{\"a\": 12345678}"), 10).unwrap_err().status,
            413
        );
        assert_eq!(json_body(&request("application/json", "{"), 10).unwrap_err().status, 400);
        let deep = "[".repeat(10_000) + &"]".repeat(10_000);
        assert_eq!(
            json_body(&request("application/json", &deep), 100_000).unwrap_err().status,
            400
        );
    }
}
