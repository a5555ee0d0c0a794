//! Lambda event filtering (`FilterCriteria.Filters[].Pattern`): the subset of EventBridge's
//! pattern syntax the local stack honours, parsed once at startup and matched against each
//! record's JSON.
//!
//! A pattern is a JSON object. A key whose value is an object matches the event's field of
//! that name with the nested pattern; every key must match (AND). A key whose value is an
//! array is a leaf: it matches when one of the array's alternatives (OR) matches the field's
//! value, or, when the value is an array, any of its elements. An alternative is a literal
//! (string, number, boolean, null: equality) or one operator: `{"exists": bool}`,
//! `{"prefix": "…"}`, `{"anything-but": literal | [literals] | {"prefix": "…"}}`, or
//! `{"numeric": [op, number, (op, number)]}`. Anything else is an error naming the construct,
//! so a pattern the local stack cannot honour stops it at startup instead of filtering
//! differently from AWS.

use anyhow::{anyhow, bail};
use serde_json::Value;

/// A parsed filter pattern.
#[derive(Debug, Clone, PartialEq)]
pub struct Pattern(Vec<(String, Node)>);

#[derive(Debug, Clone, PartialEq)]
enum Node {
    /// A nested object: every key must match.
    Object(Vec<(String, Node)>),
    /// A leaf: one of the alternatives must match.
    Leaf(Vec<Matcher>),
}

#[derive(Debug, Clone, PartialEq)]
enum Matcher {
    Literal(Value),
    Exists(bool),
    Prefix(String),
    AnythingBut(Vec<Value>),
    AnythingButPrefix(String),
    Numeric(Vec<(Comparison, f64)>),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Comparison {
    Eq,
    Lt,
    Le,
    Gt,
    Ge,
}

impl Pattern {
    /// Parses a pattern from its JSON text (as `FilterCriteria` carries it).
    pub fn parse(text: &str) -> anyhow::Result<Pattern> {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| anyhow!("the filter pattern is not JSON: {e}"))?;
        Self::from_value(&value)
    }

    /// Parses a pattern from JSON.
    pub fn from_value(value: &Value) -> anyhow::Result<Pattern> {
        match value {
            Value::Object(_) => Ok(Pattern(object(value, "")?)),
            other => bail!("a filter pattern must be a JSON object, not {other}"),
        }
    }

    /// Whether `event` (one record's JSON) matches.
    pub fn matches(&self, event: &Value) -> bool {
        object_matches(&self.0, &[event])
    }

    /// Whether `event` matches at least one of `patterns`; no patterns at all let every event
    /// through (a mapping without `FilterCriteria`).
    pub fn any_matches(patterns: &[Pattern], event: &Value) -> bool {
        patterns.is_empty() || patterns.iter().any(|p| p.matches(event))
    }
}

fn object(value: &Value, path: &str) -> anyhow::Result<Vec<(String, Node)>> {
    let Value::Object(map) = value else { bail!("{path}: expected an object") };
    map.iter()
        .map(|(key, child)| {
            let path = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
            let node = match child {
                Value::Object(_) => Node::Object(object(child, &path)?),
                Value::Array(alternatives) => {
                    if alternatives.is_empty() {
                        bail!("{path}: a leaf needs at least one alternative");
                    }
                    Node::Leaf(
                        alternatives
                            .iter()
                            .map(|a| matcher(a, &path))
                            .collect::<anyhow::Result<_>>()?,
                    )
                }
                other => bail!("{path}: a leaf must be an array of alternatives, not {other}"),
            };
            Ok((key.clone(), node))
        })
        .collect()
}

fn matcher(value: &Value, path: &str) -> anyhow::Result<Matcher> {
    let Value::Object(map) = value else { return Ok(Matcher::Literal(value.clone())) };
    let mut entries = map.iter();
    let (Some((op, arg)), None) = (entries.next(), entries.next()) else {
        bail!("{path}: an operator object must have exactly one key, found {value}");
    };
    Ok(match (op.as_str(), arg) {
        ("exists", Value::Bool(b)) => Matcher::Exists(*b),
        ("prefix", Value::String(p)) => Matcher::Prefix(p.clone()),
        ("anything-but", Value::Array(items))
            if items.iter().all(is_literal) && !items.is_empty() =>
        {
            Matcher::AnythingBut(items.clone())
        }
        ("anything-but", Value::Object(inner)) => match inner.iter().next() {
            Some((op, Value::String(p))) if op == "prefix" && inner.len() == 1 => {
                Matcher::AnythingButPrefix(p.clone())
            }
            _ => bail!(
                "{path}: anything-but {arg} is not supported by the local stack (only literals and prefix)"
            ),
        },
        ("anything-but", literal) if is_literal(literal) => {
            Matcher::AnythingBut(vec![literal.clone()])
        }
        ("numeric", Value::Array(items)) => Matcher::Numeric(numeric(items, path)?),
        ("exists" | "prefix" | "anything-but" | "numeric", _) => {
            bail!("{path}: {op} does not take {arg}")
        }
        (other, _) => {
            bail!("{path}: the filter operator {other:?} is not supported by the local stack")
        }
    })
}

fn is_literal(value: &Value) -> bool {
    !matches!(value, Value::Object(_) | Value::Array(_))
}

fn numeric(items: &[Value], path: &str) -> anyhow::Result<Vec<(Comparison, f64)>> {
    if items.is_empty() || !items.len().is_multiple_of(2) || items.len() > 4 {
        bail!("{path}: numeric needs one or two (operator, number) pairs");
    }
    items
        .chunks(2)
        .map(|pair| {
            let op = match pair[0].as_str() {
                Some("=") => Comparison::Eq,
                Some("<") => Comparison::Lt,
                Some("<=") => Comparison::Le,
                Some(">") => Comparison::Gt,
                Some(">=") => Comparison::Ge,
                _ => bail!("{path}: {} is not a numeric operator", pair[0]),
            };
            let n = pair[1]
                .as_f64()
                .ok_or_else(|| anyhow!("{path}: numeric compares with numbers, not {}", pair[1]))?;
            Ok((op, n))
        })
        .collect()
}

/// The values of field `key` of each of `values`, arrays flattened (EventBridge matches a
/// pattern against every element of an array).
fn field<'a>(values: &[&'a Value], key: &str) -> Vec<&'a Value> {
    fn flatten<'a>(value: &'a Value, out: &mut Vec<&'a Value>) {
        match value {
            Value::Array(items) => items.iter().for_each(|item| flatten(item, out)),
            other => out.push(other),
        }
    }
    let mut out = Vec::new();
    for value in values {
        if let Value::Object(map) = value
            && let Some(child) = map.get(key)
        {
            flatten(child, &mut out);
        }
    }
    out
}

fn object_matches(children: &[(String, Node)], values: &[&Value]) -> bool {
    children.iter().all(|(key, node)| {
        let found = field(values, key);
        match node {
            Node::Object(grandchildren) => object_matches(grandchildren, &found),
            Node::Leaf(alternatives) => {
                // Only leaf values count: `exists` does not match an intermediate object.
                let leaves: Vec<&Value> = found.into_iter().filter(|v| !v.is_object()).collect();
                alternatives.iter().any(|m| m.matches(&leaves))
            }
        }
    })
}

fn equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

impl Matcher {
    /// Whether the field's leaf values (none: the field is absent) satisfy this alternative.
    fn matches(&self, values: &[&Value]) -> bool {
        match self {
            Matcher::Literal(literal) => values.iter().any(|v| equal(v, literal)),
            Matcher::Exists(wanted) => values.is_empty() != *wanted,
            Matcher::Prefix(prefix) => {
                values.iter().any(|v| v.as_str().is_some_and(|s| s.starts_with(prefix.as_str())))
            }
            Matcher::AnythingBut(excluded) => {
                values.iter().any(|v| !excluded.iter().any(|e| equal(v, e)))
            }
            Matcher::AnythingButPrefix(prefix) => {
                values.iter().any(|v| v.as_str().is_some_and(|s| !s.starts_with(prefix.as_str())))
            }
            Matcher::Numeric(conditions) => values.iter().any(|v| {
                v.as_f64().is_some_and(|n| {
                    conditions.iter().all(|(op, bound)| match op {
                        Comparison::Eq => n == *bound,
                        Comparison::Lt => n < *bound,
                        Comparison::Le => n <= *bound,
                        Comparison::Gt => n > *bound,
                        Comparison::Ge => n >= *bound,
                    })
                })
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The notifier's pattern, as template.yaml declares it.
    const NOTIFIER: &str = r#"{"eventName": ["MODIFY"], "dynamodb": {"Keys": {"sk": {"S": ["JOB"]}}, "NewImage": {"status": {"S": ["succeeded", "failed", "cancelled"]}, "callback_url": {"S": [{"exists": true}]}}, "OldImage": {"status": {"S": [{"anything-but": ["succeeded", "failed", "cancelled"]}]}}}}"#;

    fn record(
        event_name: &str,
        sk: &str,
        old: Option<&str>,
        new: Option<&str>,
        callback: bool,
    ) -> Value {
        let image = |status: &str| {
            let mut image = json!({"pk": {"S": "JOB#1"}, "sk": {"S": sk}, "status": {"S": status}});
            if callback {
                image["callback_url"] = json!({"S": "https://partner.example.com/hook"});
            }
            image
        };
        let mut dynamodb =
            json!({"Keys": {"pk": {"S": "JOB#1"}, "sk": {"S": sk}}, "SequenceNumber": "1"});
        if let Some(old) = old {
            dynamodb["OldImage"] = image(old);
        }
        if let Some(new) = new {
            dynamodb["NewImage"] = image(new);
        }
        json!({"eventName": event_name, "eventSource": "aws:dynamodb", "dynamodb": dynamodb})
    }

    #[test]
    fn the_notifier_pattern_lets_only_a_move_into_a_terminal_status_with_a_callback_through() {
        let p = Pattern::parse(NOTIFIER).unwrap();
        assert!(p.matches(&record("MODIFY", "JOB", Some("running"), Some("succeeded"), true)));
        assert!(p.matches(&record("MODIFY", "JOB", Some("queued"), Some("cancelled"), true)));
        assert!(p.matches(&record("MODIFY", "JOB", Some("running"), Some("failed"), true)));
        assert!(
            !p.matches(&record("MODIFY", "JOB", Some("running"), Some("succeeded"), false)),
            "no callback"
        );
        assert!(
            !p.matches(&record("MODIFY", "JOB", Some("succeeded"), Some("expired"), true)),
            "terminal → expired"
        );
        assert!(
            !p.matches(&record("MODIFY", "JOB", Some("failed"), Some("failed"), true)),
            "already terminal"
        );
        assert!(!p.matches(&record("INSERT", "JOB", None, Some("succeeded"), true)), "an insert");
        assert!(!p.matches(&record("REMOVE", "JOB", Some("running"), None, true)), "a removal");
        assert!(
            !p.matches(&record("MODIFY", "PROGRESS", Some("running"), Some("succeeded"), true)),
            "a progress item"
        );
        assert!(
            !p.matches(&record("MODIFY", "JOB", Some("running"), Some("running"), true)),
            "still running"
        );
    }

    #[test]
    fn literals_match_by_value_and_any_element_of_an_array() {
        let p = Pattern::parse(r#"{"n": [5], "b": [true], "z": [null], "tags": ["red"]}"#).unwrap();
        assert!(p.matches(&json!({"n": 5.0, "b": true, "z": null, "tags": ["blue", "red"]})));
        assert!(
            !p.matches(&json!({"n": "5", "b": true, "z": null, "tags": ["red"]})),
            "types differ"
        );
        assert!(!p.matches(&json!({"n": 5, "b": true, "tags": ["red"]})), "null is not absence");
        assert!(!p.matches(&json!({"n": 5, "b": true, "z": null, "tags": []})));
    }

    #[test]
    fn exists_prefix_anything_but_and_numeric() {
        let absent = Pattern::parse(r#"{"a": {"b": [{"exists": false}]}}"#).unwrap();
        assert!(absent.matches(&json!({})), "an absent parent is an absent field");
        assert!(absent.matches(&json!({"a": {"c": 1}})));
        assert!(!absent.matches(&json!({"a": {"b": 1}})));
        let present = Pattern::parse(r#"{"a": [{"exists": true}]}"#).unwrap();
        assert!(present.matches(&json!({"a": "x"})));
        assert!(!present.matches(&json!({"a": {"b": 1}})), "exists only matches leaves");
        let prefix = Pattern::parse(r#"{"k": [{"prefix": "JOB#"}]}"#).unwrap();
        assert!(prefix.matches(&json!({"k": "JOB#1"})) && !prefix.matches(&json!({"k": "IDEM#1"})));
        let but = Pattern::parse(
            r#"{"k": [{"anything-but": "x"}], "p": [{"anything-but": {"prefix": "a"}}]}"#,
        )
        .unwrap();
        assert!(but.matches(&json!({"k": "y", "p": "b"})));
        assert!(
            !but.matches(&json!({"k": "x", "p": "b"}))
                && !but.matches(&json!({"k": "y", "p": "ab"}))
        );
        assert!(!but.matches(&json!({"p": "b"})), "anything-but needs the field");
        let numeric = Pattern::parse(r#"{"n": [{"numeric": [">", 0, "<=", 5]}]}"#).unwrap();
        assert!(
            numeric.matches(&json!({"n": 5}))
                && !numeric.matches(&json!({"n": 0}))
                && !numeric.matches(&json!({"n": "3"}))
        );
    }

    #[test]
    fn no_patterns_let_everything_through_and_several_are_alternatives() {
        assert!(Pattern::any_matches(&[], &json!({"a": 1})));
        let patterns =
            [Pattern::parse(r#"{"a": [1]}"#).unwrap(), Pattern::parse(r#"{"a": [2]}"#).unwrap()];
        assert!(Pattern::any_matches(&patterns, &json!({"a": 2})));
        assert!(!Pattern::any_matches(&patterns, &json!({"a": 3})));
    }

    #[test]
    fn unsupported_patterns_are_errors_naming_the_construct() {
        let error = |text: &str| Pattern::parse(text).unwrap_err().to_string();
        assert!(error(r#"{"a": [{"suffix": ".png"}]}"#).contains("\"suffix\""));
        assert!(error(r#"{"a": [{"equals-ignore-case": "x"}]}"#).contains("equals-ignore-case"));
        assert!(error(r#"{"a": [{"wildcard": "x*"}]}"#).contains("wildcard"));
        assert!(error(r#"{"a": [{"anything-but": {"suffix": "x"}}]}"#).contains("anything-but"));
        assert!(error(r#"{"a": [{"exists": "yes"}]}"#).contains("exists"));
        assert!(error(r#"{"a": "x"}"#).contains("array of alternatives"));
        assert!(error(r#"{"a": []}"#).contains("at least one"));
        assert!(error(r#"{"a": [{"prefix": "x", "exists": true}]}"#).contains("exactly one key"));
        assert!(error("[1]").contains("object"));
        assert!(error("{").contains("not JSON"));
    }
}
