//! Reads `template.yaml` and resolves what the local stack needs from it: resources with
//! their physical names, function environments, event sources, schedules and API routes.
//!
//! Only the intrinsic functions the template uses are resolved (`Ref`, `Fn::GetAtt`,
//! `Fn::Sub`, `Fn::Join`); anything else is an error naming the construct, so a template
//! change the local stack cannot honour fails loudly instead of running something different.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow, bail};
use serde_json::{Map, Value, json};

/// The account id the emulator uses.
pub const ACCOUNT: &str = "123456789012";
/// The region of the local stack.
pub const REGION: &str = "us-east-1";

// `Not` and `Equals` appear only in `Conditions` (reserved concurrency), which the local stack
// reads but never resolves.
const INTRINSICS: [&str; 12] = [
    "Ref",
    "GetAtt",
    "Sub",
    "Join",
    "Select",
    "If",
    "FindInMap",
    "Base64",
    "Split",
    "ImportValue",
    "Not",
    "Equals",
];

/// The parsed template.
#[derive(Debug, Clone)]
pub struct Template {
    /// The folder the template lives in (relative paths resolve against it).
    pub dir: PathBuf,
    /// `Parameters` with their defaults (or overrides).
    pub parameters: BTreeMap<String, String>,
    /// `Globals.Function`.
    pub function_globals: Value,
    /// `Resources`, in logical-id order, with intrinsics in long form.
    pub resources: BTreeMap<String, Value>,
    /// The stack name used to derive physical names.
    pub stack: String,
    /// Base URL queue URLs are built on (the edge).
    pub queue_endpoint: String,
    /// Base URL function URLs are served under (the local API: `<base>/_fn/<LogicalId>`).
    pub function_url_base: String,
}

/// Converts YAML (with CloudFormation short-form tags) to JSON with long-form intrinsics.
fn yaml_to_json(value: serde_norway::Value) -> anyhow::Result<Value> {
    use serde_norway::Value as Y;
    Ok(match value {
        Y::Null => Value::Null,
        Y::Bool(b) => Value::Bool(b),
        Y::Number(n) => serde_json::to_value(&n)?,
        Y::String(s) => Value::String(s),
        Y::Sequence(items) => {
            Value::Array(items.into_iter().map(yaml_to_json).collect::<Result<_, _>>()?)
        }
        Y::Mapping(map) => {
            let mut out = Map::new();
            for (k, v) in map {
                let key = match k {
                    Y::String(s) => s,
                    other => serde_norway::to_string(&other)?.trim().to_owned(),
                };
                out.insert(key, yaml_to_json(v)?);
            }
            Value::Object(out)
        }
        Y::Tagged(tagged) => {
            let name = INTRINSICS
                .iter()
                .find(|name| tagged.tag == **name)
                .ok_or_else(|| anyhow!("unsupported YAML tag {}", tagged.tag))?;
            let inner = yaml_to_json(tagged.value)?;
            match *name {
                "Ref" => json!({ "Ref": inner }),
                // `!GetAtt A.B` is short for `Fn::GetAtt: [A, B]`.
                "GetAtt" => match inner {
                    Value::String(s) => {
                        let (resource, attr) = s
                            .split_once('.')
                            .ok_or_else(|| anyhow!("!GetAtt {s} needs Resource.Attribute"))?;
                        json!({ "Fn::GetAtt": [resource, attr] })
                    }
                    other => json!({ "Fn::GetAtt": other }),
                },
                other => json!({ format!("Fn::{other}"): inner }),
            }
        }
    })
}

impl Template {
    /// Loads `path`, taking parameter defaults unless `overrides` names them.
    pub fn load(
        path: &Path,
        stack: &str,
        queue_endpoint: &str,
        function_url_base: &str,
        overrides: &BTreeMap<String, String>,
    ) -> anyhow::Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let yaml: serde_norway::Value =
            serde_norway::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        let doc = yaml_to_json(yaml)?;
        let mut parameters = BTreeMap::new();
        for (name, spec) in doc["Parameters"].as_object().cloned().unwrap_or_default() {
            let value = overrides.get(&name).cloned().or_else(|| match &spec["Default"] {
                Value::String(s) => Some(s.clone()),
                Value::Null => None,
                other => Some(other.to_string()),
            });
            parameters.insert(
                name.clone(),
                value.ok_or_else(|| anyhow!("parameter {name} has no default"))?,
            );
        }
        Ok(Template {
            dir: path.parent().unwrap_or(Path::new(".")).to_path_buf(),
            parameters,
            function_globals: doc["Globals"]["Function"].clone(),
            resources: doc["Resources"]
                .as_object()
                .ok_or_else(|| anyhow!("template has no Resources"))?
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            stack: stack.to_owned(),
            queue_endpoint: queue_endpoint.trim_end_matches('/').to_owned(),
            function_url_base: function_url_base.trim_end_matches('/').to_owned(),
        })
    }

    /// Logical ids of resources of `kind`.
    pub fn of_type<'a>(
        &'a self,
        kind: &'a str,
    ) -> impl Iterator<Item = (&'a String, &'a Value)> + 'a {
        self.resources.iter().filter(move |(_, r)| r["Type"] == kind)
    }

    fn resource(&self, logical: &str) -> anyhow::Result<&Value> {
        self.resources.get(logical).ok_or_else(|| anyhow!("no resource {logical} in the template"))
    }

    /// The physical name of a resource: its explicit name property, or `<stack>-<LogicalId>`.
    pub fn physical_name(&self, logical: &str) -> anyhow::Result<String> {
        let resource = self.resource(logical)?;
        let props = &resource["Properties"];
        let explicit = match resource["Type"].as_str().unwrap_or_default() {
            "AWS::DynamoDB::Table" => &props["TableName"],
            "AWS::SQS::Queue" => &props["QueueName"],
            "AWS::S3::Bucket" => &props["BucketName"],
            "AWS::Serverless::Function" => &props["FunctionName"],
            "AWS::Serverless::StateMachine" => &props["Name"],
            _ => &Value::Null,
        };
        if !explicit.is_null() {
            return self.resolve_string(explicit);
        }
        let name = format!("{}-{logical}", self.stack);
        Ok(if resource["Type"] == "AWS::S3::Bucket" { name.to_lowercase() } else { name })
    }

    /// `Ref` of a resource or parameter.
    pub fn reference(&self, name: &str) -> anyhow::Result<String> {
        match name {
            "AWS::Region" => return Ok(REGION.into()),
            "AWS::AccountId" => return Ok(ACCOUNT.into()),
            "AWS::StackName" => return Ok(self.stack.clone()),
            "AWS::Partition" => return Ok("aws".into()),
            "AWS::URLSuffix" => return Ok("amazonaws.com".into()),
            _ => {}
        }
        if let Some(value) = self.parameters.get(name) {
            return Ok(value.clone());
        }
        let kind = self.resource(name)?["Type"].as_str().unwrap_or_default().to_owned();
        let physical = self.physical_name(name)?;
        Ok(match kind.as_str() {
            "AWS::SQS::Queue" => format!("{}/{ACCOUNT}/{physical}", self.queue_endpoint),
            "AWS::Serverless::StateMachine" => {
                format!("arn:aws:states:{REGION}:{ACCOUNT}:stateMachine:{physical}")
            }
            "AWS::Serverless::HttpApi" => "local".into(),
            _ => physical,
        })
    }

    /// `Fn::GetAtt` of a resource.
    pub fn attribute(&self, logical: &str, attr: &str) -> anyhow::Result<String> {
        // SAM's implicit `<Function>Url` resource of a function with FunctionUrlConfig.
        if attr == "FunctionUrl"
            && let Some(function) = logical.strip_suffix("Url")
            && self
                .resources
                .get(function)
                .is_some_and(|r| !r["Properties"]["FunctionUrlConfig"].is_null())
        {
            return Ok(format!("{}/_fn/{function}/", self.function_url_base));
        }
        let kind = self.resource(logical)?["Type"].as_str().unwrap_or_default().to_owned();
        let name = self.physical_name(logical)?;
        Ok(match (kind.as_str(), attr) {
            ("AWS::DynamoDB::Table", "Arn") => {
                format!("arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{name}")
            }
            ("AWS::SQS::Queue", "Arn") => format!("arn:aws:sqs:{REGION}:{ACCOUNT}:{name}"),
            ("AWS::SQS::Queue", "QueueName") => name,
            ("AWS::SQS::Queue", "QueueUrl") => self.reference(logical)?,
            ("AWS::S3::Bucket", "Arn") => format!("arn:aws:s3:::{name}"),
            ("AWS::Serverless::Function", "Arn") => function_arn(&name),
            ("AWS::Serverless::StateMachine", "Arn") => self.reference(logical)?,
            ("AWS::Serverless::StateMachine", "Name") => name,
            // The emulator names a stream by its creation time: the ARN exists only at runtime
            // (the table's LatestStreamArn), which the stream mappings look up themselves.
            ("AWS::DynamoDB::Table", "StreamArn") => {
                bail!(
                    "Fn::GetAtt {logical}.StreamArn is only known at runtime locally; only a DynamoDB event's Stream may name it"
                )
            }
            _ => bail!("Fn::GetAtt {logical}.{attr} is not supported by the local stack"),
        })
    }

    /// Resolves every intrinsic in `value`.
    pub fn resolve(&self, value: &Value) -> anyhow::Result<Value> {
        Ok(match value {
            Value::Array(items) => {
                Value::Array(items.iter().map(|v| self.resolve(v)).collect::<Result<_, _>>()?)
            }
            Value::Object(map) if map.len() == 1 => {
                let (key, arg) = map.iter().next().expect("one entry");
                match key.as_str() {
                    "Ref" => Value::String(
                        self.reference(arg.as_str().ok_or_else(|| anyhow!("Ref needs a name"))?)?,
                    ),
                    "Fn::GetAtt" => {
                        let parts: Vec<String> = self
                            .resolve(arg)?
                            .as_array()
                            .ok_or_else(|| anyhow!("Fn::GetAtt needs [resource, attribute]"))?
                            .iter()
                            .map(|v| v.as_str().unwrap_or_default().to_owned())
                            .collect();
                        let [resource, attr] = parts.as_slice() else {
                            bail!("Fn::GetAtt needs two parts")
                        };
                        Value::String(self.attribute(resource, attr)?)
                    }
                    "Fn::Sub" => Value::String(self.substitute(arg)?),
                    "Fn::Join" => {
                        let arg = self.resolve(arg)?;
                        let sep = arg[0].as_str().unwrap_or_default();
                        let parts: Vec<&str> = arg[1]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(Value::as_str)
                            .collect();
                        Value::String(parts.join(sep))
                    }
                    other if other.starts_with("Fn::") => {
                        bail!("{other} is not supported by the local stack")
                    }
                    _ => Value::Object(
                        map.iter()
                            .map(|(k, v)| Ok((k.clone(), self.resolve(v)?)))
                            .collect::<anyhow::Result<_>>()?,
                    ),
                }
            }
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(k, v)| Ok((k.clone(), self.resolve(v)?)))
                    .collect::<anyhow::Result<_>>()?,
            ),
            other => other.clone(),
        })
    }

    /// A resolved string.
    pub fn resolve_string(&self, value: &Value) -> anyhow::Result<String> {
        match self.resolve(value)? {
            Value::String(s) => Ok(s),
            Value::Number(n) => Ok(n.to_string()),
            Value::Bool(b) => Ok(b.to_string()),
            other => bail!("expected a string, found {other}"),
        }
    }

    fn substitute(&self, arg: &Value) -> anyhow::Result<String> {
        let (text, vars) = match arg {
            Value::String(s) => (s.as_str(), Map::new()),
            Value::Array(items) => (
                items
                    .first()
                    .and_then(Value::as_str)
                    .ok_or_else(|| anyhow!("Fn::Sub needs a string"))?,
                items.get(1).and_then(Value::as_object).cloned().unwrap_or_default(),
            ),
            _ => bail!("Fn::Sub needs a string"),
        };
        substitute(text, |name| match vars.get(name) {
            Some(v) => self.resolve_string(v),
            None => match name.split_once('.') {
                Some((resource, attr)) if !name.starts_with("AWS::") => {
                    self.attribute(resource, attr)
                }
                _ => self.reference(name),
            },
        })
    }

    /// A function's `Timeout`, from the function or the globals (Lambda's default is 3 s).
    pub fn function_timeout(&self, logical: &str) -> anyhow::Result<u64> {
        let props = &self.resource(logical)?["Properties"];
        let value = if props["Timeout"].is_null() {
            &self.function_globals["Timeout"]
        } else {
            &props["Timeout"]
        };
        Ok(if value.is_null() { 3 } else { self.resolve_string(value)?.parse()? })
    }

    /// A function's environment: globals overlaid with its own variables, resolved.
    pub fn function_environment(&self, logical: &str) -> anyhow::Result<BTreeMap<String, String>> {
        let props = &self.resource(logical)?["Properties"];
        let mut env = BTreeMap::new();
        for source in
            [&self.function_globals["Environment"]["Variables"], &props["Environment"]["Variables"]]
        {
            for (name, value) in source.as_object().into_iter().flatten() {
                env.insert(name.clone(), self.resolve_string(value)?);
            }
        }
        Ok(env)
    }
}

/// Replaces `${name}` in `text` (leaving `${!literal}` as `${literal}`).
pub fn substitute(
    text: &str,
    mut lookup: impl FnMut(&str) -> anyhow::Result<String>,
) -> anyhow::Result<String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let end =
            rest[start..].find('}').ok_or_else(|| anyhow!("unclosed ${{ in {text:?}"))? + start;
        let name = &rest[start + 2..end];
        match name.strip_prefix('!') {
            Some(literal) => {
                out.push_str("${");
                out.push_str(literal);
                out.push('}');
            }
            None => out.push_str(&lookup(name)?),
        }
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The ARN of the function named `name`.
pub fn function_arn(name: &str) -> String {
    format!("arn:aws:lambda:{REGION}:{ACCOUNT}:function:{name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn substitution() {
        let out = substitute("a${X}b${!Y}c", |n| Ok(format!("<{n}>"))).unwrap();
        assert_eq!(out, "a<X>b${Y}c");
    }

    #[test]
    fn the_real_template_resolves() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../template.yaml");
        let t = Template::load(
            &path,
            "longhaul",
            "http://127.0.0.1:1",
            "http://127.0.0.1:2",
            &BTreeMap::new(),
        )
        .unwrap();
        for (logical, _) in t.of_type("AWS::Serverless::Function") {
            let env = t.function_environment(logical).unwrap();
            assert!(env.contains_key("TABLE_NAME"), "{logical}");
        }
        assert_eq!(t.reference("JobsTable").unwrap(), "longhaul-JobsTable");
    }
}
