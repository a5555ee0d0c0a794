//! Holds the API to its description: every response the tests receive is checked against
//! `docs/openapi.json` — the path and method must be documented (or the answer must be the
//! documented 404/405 problem), the status must be listed for the operation, and a JSON body
//! must validate against the schema for that status and media type.

use std::sync::LazyLock;

use serde_json::Value;

use crate::Reply;

/// The API description.
pub static DOCUMENT: LazyLock<Value> = LazyLock::new(|| {
    let text = std::fs::read_to_string(crate::root().join("docs/openapi.json"))
        .expect("docs/openapi.json");
    serde_json::from_str(&text).expect("docs/openapi.json is JSON")
});

/// `components.schemas`, with references rewritten so each schema validates standalone.
static DEFS: LazyLock<Value> = LazyLock::new(|| {
    let schemas =
        DOCUMENT["components"]["schemas"].to_string().replace("#/components/schemas/", "#/$defs/");
    serde_json::from_str(&schemas).expect("schemas")
});

/// The documented path template that `path` falls under.
pub fn path_template(path: &str) -> Option<String> {
    let path = path.split('?').next().unwrap_or(path);
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    DOCUMENT["paths"]
        .as_object()?
        .keys()
        .find(|template| {
            let segments: Vec<&str> = template.trim_start_matches('/').split('/').collect();
            segments.len() == parts.len()
                && segments
                    .iter()
                    .zip(&parts)
                    .all(|(s, p)| (s.starts_with('{') && !p.is_empty()) || s == p)
        })
        .cloned()
}

fn validate(schema: &Value, instance: &Value) -> Result<(), String> {
    let mut root: Value =
        serde_json::from_str(&schema.to_string().replace("#/components/schemas/", "#/$defs/"))
            .expect("schema");
    if let Value::Object(map) = &mut root {
        map.insert("$defs".into(), DEFS.clone());
    }
    let validator = jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .should_validate_formats(true)
        .build(&root)
        .map_err(|e| format!("invalid schema: {e}"))?;
    let errors: Vec<String> = validator
        .iter_errors(instance)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    if errors.is_empty() { Ok(()) } else { Err(errors.join("; ")) }
}

/// Panics unless `reply` to `method path` is what the API description says it can be.
pub fn check(method: &str, path: &str, reply: &Reply) {
    let context = format!(
        "{method} {path} → {} {}",
        reply.status,
        reply.text.chars().take(300).collect::<String>()
    );
    assert!(reply.status < 500, "the API answered a server error: {context}");
    let content_type = reply
        .header("content-type")
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_owned();
    // A route without the gateway's authorizer (`security: []`) answers its own 401s.
    let public = path_template(path).is_some_and(|template| {
        DOCUMENT["paths"][&template][method.to_lowercase()]["security"]
            .as_array()
            .is_some_and(|schemes| schemes.is_empty())
    });
    if reply.status == 401 && !public {
        // The gateway's own answer, the same for every route.
        assert_eq!(reply.json, serde_json::json!({"message": "Unauthorized"}), "{context}");
        return;
    }
    let Some(template) = path_template(path) else {
        assert_eq!(reply.status, 404, "undocumented path: {context}");
        assert_eq!(content_type, "application/problem+json", "{context}");
        return;
    };
    let item = &DOCUMENT["paths"][&template];
    let operation = &item[method.to_lowercase()];
    if operation.is_null() {
        assert_eq!(reply.status, 405, "undocumented method: {context}");
        assert_eq!(content_type, "application/problem+json", "{context}");
        assert!(reply.header("allow").is_some(), "405 without Allow: {context}");
        return;
    }
    let response = &operation["responses"][reply.status.to_string()];
    assert!(
        !response.is_null(),
        "status {} is not documented for {method} {template}: {context}",
        reply.status
    );
    if reply.text.is_empty() {
        return;
    }
    let media = &response["content"][&content_type];
    assert!(
        !media.is_null(),
        "{content_type:?} is not documented for {} of {method} {template}: {context}",
        reply.status
    );
    if let Err(errors) = validate(&media["schema"], &reply.json) {
        panic!("the body does not match the documented schema: {errors}\n{context}");
    }
}
