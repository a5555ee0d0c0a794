//! API Gateway requests as the HTTP API hands them to a function — method, path, route, path
//! parameters, the verified token's principal, headers, body — for calling an API handler
//! directly in a unit test.

use std::collections::HashMap;

use lambda_http::aws_lambda_events::apigw::{
    ApiGatewayRequestAuthorizer, ApiGatewayRequestAuthorizerJwtDescription,
    ApiGatewayV2httpRequestContext,
};
use lambda_http::request::RequestContext;
use lambda_http::{Body, Request, RequestExt};

/// A request under construction.
#[derive(Debug, Clone)]
pub struct ApiRequest {
    method: String,
    path: String,
    route: Option<String>,
    principal: Option<String>,
    path_parameters: HashMap<String, String>,
    query: HashMap<String, String>,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl ApiRequest {
    /// `method path`, from `principal` (the token's `sub`), with no body.
    pub fn new(method: &str, path: &str, principal: &str) -> Self {
        ApiRequest {
            method: method.to_owned(),
            path: path.to_owned(),
            route: None,
            principal: Some(principal.to_owned()),
            path_parameters: HashMap::new(),
            query: HashMap::new(),
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    /// Without a verified token (the authorizer let nothing through: a misconfiguration).
    pub fn anonymous(mut self) -> Self {
        self.principal = None;
        self
    }

    /// The route key API Gateway matched (`"GET /jobs/{id}"`).
    pub fn route(mut self, route: &str) -> Self {
        self.route = Some(route.to_owned());
        self
    }

    /// A path parameter (`{id}`).
    pub fn param(mut self, name: &str, value: &str) -> Self {
        self.path_parameters.insert(name.to_owned(), value.to_owned());
        self
    }

    /// A query-string parameter.
    pub fn query(mut self, name: &str, value: &str) -> Self {
        self.query.insert(name.to_owned(), value.to_owned());
        self
    }

    /// A header.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// A JSON body, with its content type.
    pub fn json(self, body: &serde_json::Value) -> Self {
        self.header("content-type", "application/json").raw_body(body.to_string().as_bytes())
    }

    /// A body as given (no content type).
    pub fn raw_body(mut self, body: &[u8]) -> Self {
        self.body = body.to_vec();
        self
    }

    /// The request.
    pub fn build(self) -> Request {
        let mut builder = lambda_http::http::Request::builder()
            .method(self.method.as_str())
            .uri(format!("https://api.memory.invalid{}", self.path));
        for (name, value) in &self.headers {
            builder = builder.header(name, value);
        }
        let body = if self.body.is_empty() { Body::Empty } else { Body::Binary(self.body) };
        let request = builder.body(body).expect("a test request is well-formed");
        let mut context = ApiGatewayV2httpRequestContext::default();
        context.route_key = self.route;
        if let Some(principal) = self.principal {
            let mut jwt = ApiGatewayRequestAuthorizerJwtDescription::default();
            jwt.claims.insert("sub".to_owned(), principal);
            let mut authorizer = ApiGatewayRequestAuthorizer::default();
            authorizer.jwt = Some(jwt);
            context.authorizer = Some(authorizer);
        }
        request
            .with_request_context(RequestContext::ApiGatewayV2(context))
            .with_path_parameters(self.path_parameters)
            .with_query_string_parameters(self.query)
    }
}

/// A response's body as JSON (a problem, a job view).
pub fn json_of(response: &lambda_http::Response<Body>) -> serde_json::Value {
    serde_json::from_slice(response.body().as_ref()).expect("the response body is JSON")
}
