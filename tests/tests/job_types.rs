//! Job kinds through the registry, as clients see them: `GET /job-types` lists the enabled
//! kinds with their stages, params schema and policy, and `POST /jobs` validates through the
//! same registry (an unknown kind is a 422 naming the enabled ones).

use longhaul_tests::{Api, harness, principal};
use serde_json::{Value, json};

#[tokio::test]
async fn job_types_lists_the_enabled_kinds_with_a_usable_params_schema() {
    let api = Api::new(&principal("job-types"));
    let reply = api.get("/job-types").await;
    assert_eq!(reply.status, 200, "{}", reply.text);
    // Exactly the catalog's kinds the stack's `EnabledJobTypes` enables, in the catalog's
    // order, each as its code describes it: stages, params schema, policy.
    let catalog = longhaul_jobs::registry();
    let enabled = &harness().stack.template.parameters["EnabledJobTypes"];
    let expected = catalog.enabled(&catalog.enabled_names(Some(enabled)).unwrap()).describe();
    assert_eq!(reply.json, expected, "EnabledJobTypes {enabled:?}");
    // Which is every kind the catalog registers: the template's default (`*`) is every kind
    // but the opt-in `demo`, which the local stack adds.
    let kinds = reply.json["job_types"].as_array().expect("a list").clone();
    let names: Vec<&str> = kinds.iter().filter_map(|k| k["type"].as_str()).collect();
    let default = catalog.default_names();
    assert!(["csv_report", "archive"].iter().all(|k| default.contains(k)), "{default:?}");
    for kind in default.into_iter().chain(["demo"]) {
        assert!(names.contains(&kind), "{kind} is not listed: {names:?}");
    }
    let kind = |name: &str| kinds.iter().find(|k| k["type"] == name).unwrap().clone();
    assert_eq!(kind("csv_report")["stages"], json!(["scan", "render", "publish"]));
    assert_eq!(kind("demo")["stages"], json!(["process"]));
    assert_eq!(kind("demo")["policy"]["worker"], "StageFunction");
    assert!(kind("demo")["policy"]["max_runtime_seconds"].as_u64().unwrap() > 0);

    // The schema is the kind's own: what it accepts, submit accepts.
    let schema = jsonschema::validator_for(&kind("demo")["params_schema"]).expect("a schema");
    assert!(schema.is_valid(&json!({"items": 3, "item_ms": 1})));
    assert!(!schema.is_valid(&json!({"items": "3"})));
    assert!(!schema.is_valid(&json!({"items": 3, "extra": true})));
    let schema = jsonschema::validator_for(&kind("csv_report")["params_schema"]).unwrap();
    let params = json!({"input": "uploads/x/y.csv", "group_by": ["a"],
        "metrics": [{"op": "count"}, {"op": "sum", "column": "b"}], "format": "csv"});
    assert!(schema.is_valid(&params), "{params}");
    assert!(!schema.is_valid(&json!({"input": "x", "metrics": [], "format": "xml"})));
}

#[tokio::test]
async fn submit_refuses_unknown_kinds_naming_the_enabled_ones_and_the_kinds_own_messages() {
    let api = Api::new(&principal("job-types-submit"));
    let reply = api.post_json("/jobs", &json!({"type": "pdf_export", "params": {}})).await;
    assert_eq!(reply.status, 422, "{}", reply.text);
    assert_eq!(reply.json["type"], "/problems/unknown-job-type");
    let detail = reply.json["detail"].as_str().unwrap();
    assert!(detail.contains("\"pdf_export\""), "{detail}");
    assert!(detail.contains("\"demo\"") && detail.contains("\"csv_report\""), "{detail}");

    // The kind's own validation speaks to the client as it is.
    let reply = api.post_json("/jobs", &json!({"type": "demo", "params": {"items": 0}})).await;
    assert_eq!(reply.status, 422, "{}", reply.text);
    assert_eq!(reply.json["type"], "/problems/invalid-params");
    assert_eq!(reply.json["detail"], "invalid params: items must be between 1 and 10000000");
    let reply: Value = api
        .post_json("/jobs", &json!({"type": "demo", "params": {"items": 1, "extra": 1}}))
        .await
        .json;
    assert_eq!(reply["type"], "/problems/invalid-params", "{reply}");
}
