//! **console** — `GET /console` and `GET /console/{proxy+}`: the web console, a static
//! single-page app (`console/` at the repository root) compiled into this binary with
//! `include_str!`.
//!
//! Why a function and not S3 or CloudFront: the console is three small files that change only
//! with a release, so embedding them needs no bucket, no upload step after `sam deploy`, no
//! extra IAM (this function makes no AWS call at all) and no second origin — the console is
//! served by the same HTTP API as the jobs API, so it calls the API same-origin. The routes
//! carry no authorizer: the files are public; everything they do needs the caller's token.

pub mod lambda;

use lambda_http::http::{HeaderValue, StatusCode, header};
use lambda_http::{Body, Request, Response};
use longhaul_aws::api::Problem;
use sha2::{Digest, Sha256};

/// One embedded file.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static str,
}

/// The console's files, by the name under `/console/`.
const ASSETS: &[Asset] = &[
    Asset {
        name: "index.html",
        content_type: "text/html; charset=utf-8",
        body: include_str!("../../../console/index.html"),
    },
    Asset {
        name: "app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("../../../console/app.js"),
    },
    Asset {
        name: "style.css",
        content_type: "text/css; charset=utf-8",
        body: include_str!("../../../console/style.css"),
    },
];

/// The Content-Security-Policy of every file: scripts and styles only from this origin (no
/// inline script, so an injected string cannot run and read the token kept in
/// sessionStorage); `connect-src` is open because the API base is configurable and uploads,
/// downloads and streams go to presigned S3 and function-URL origins.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src *; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Serves one request: the file the path names, `index.html` for `/console/`, a redirect
/// from `/console` (relative links need the slash), a `404` problem for anything else.
pub fn handle(request: &Request) -> Response<Body> {
    let path = request.uri().path();
    if path == "/console" {
        let mut response = Response::new(Body::Empty);
        *response.status_mut() = StatusCode::PERMANENT_REDIRECT;
        response.headers_mut().insert(header::LOCATION, HeaderValue::from_static("/console/"));
        return response;
    }
    let name = match path.strip_prefix("/console/") {
        Some("") => "index.html",
        Some(name) => name,
        None => return Problem::not_found().into_response(),
    };
    let Some(asset) = ASSETS.iter().find(|a| a.name == name) else {
        return Problem::not_found().into_response();
    };
    let etag = format!("\"{}\"", &hex::encode(Sha256::digest(asset.body.as_bytes()))[..32]);
    let fresh = request
        .headers()
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|tags| tags.split(',').any(|t| t.trim() == etag));
    let mut response = if fresh {
        let mut r = Response::new(Body::Empty);
        *r.status_mut() = StatusCode::NOT_MODIFIED;
        r
    } else {
        Response::new(Body::Text(asset.body.to_owned()))
    };
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(asset.content_type));
    // Revalidated on every load (cheap: a 304), so a deploy is seen at once.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(header::ETAG, etag.parse().expect("hex is header-safe"));
    headers.insert("content-security-policy", HeaderValue::from_static(CSP));
    headers.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    headers.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(path: &str) -> Response<Body> {
        let request = lambda_http::http::Request::builder()
            .uri(format!("https://api.example{path}"))
            .body(Body::Empty)
            .unwrap();
        handle(&request)
    }

    #[test]
    fn serves_the_files_with_their_types_and_a_strict_policy() {
        for (path, kind) in [
            ("/console/", "text/html"),
            ("/console/index.html", "text/html"),
            ("/console/app.js", "text/javascript"),
            ("/console/style.css", "text/css"),
        ] {
            let response = get(path);
            assert_eq!(response.status(), 200, "{path}");
            let content_type = response.headers()[header::CONTENT_TYPE].to_str().unwrap();
            assert!(content_type.starts_with(kind), "{path}: {content_type}");
            assert!(
                response.headers()["content-security-policy"]
                    .to_str()
                    .unwrap()
                    .contains("script-src 'self'")
            );
        }
    }

    #[test]
    fn the_bare_path_redirects_and_unknown_files_are_404_problems() {
        let response = get("/console");
        assert_eq!(response.status(), 308);
        assert_eq!(response.headers()[header::LOCATION], "/console/");
        for path in ["/console/../template.yaml", "/console/nope.js", "/consolex"] {
            let response = get(path);
            assert_eq!(response.status(), 404, "{path}");
            assert_eq!(response.headers()[header::CONTENT_TYPE], "application/problem+json");
        }
    }

    #[test]
    fn a_matching_etag_is_a_304() {
        let etag = get("/console/app.js").headers()[header::ETAG].clone();
        let request = lambda_http::http::Request::builder()
            .uri("https://api.example/console/app.js")
            .header(header::IF_NONE_MATCH, etag)
            .body(Body::Empty)
            .unwrap();
        assert_eq!(handle(&request).status(), 304);
    }
}
