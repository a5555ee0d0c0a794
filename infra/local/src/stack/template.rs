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
            "AWS::Scheduler::ScheduleGroup" => &props["Name"],
            "AWS::IAM::Role" => &props["RoleName"],
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
            // AWS's Ref is the full ARN, whose last six characters are random; the emulator
            // finds a secret by this partial ARN too, and IAM matches it exactly.
            "AWS::SecretsManager::Secret" => secret_arn(&physical),
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
            ("AWS::Scheduler::ScheduleGroup", "Arn") => {
                format!("arn:aws:scheduler:{REGION}:{ACCOUNT}:schedule-group/{name}")
            }
            // AWS names a role without `RoleName` `<stack>-<LogicalId>-<random>`: the random
            // tail is left off locally, as for every other physical name.
            ("AWS::IAM::Role", "Arn") => format!("arn:aws:iam::{ACCOUNT}:role/{name}"),
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

/// The (partial) ARN of the secret named `name`: what `Ref` gives locally.
pub fn secret_arn(name: &str) -> String {
    format!("arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:{name}")
}

/// The ARN of the function named `name`.
pub fn function_arn(name: &str) -> String {
    format!("arn:aws:lambda:{REGION}:{ACCOUNT}:function:{name}")
}

/// The repository's `template.yaml`, for unit tests.
#[cfg(test)]
pub(crate) fn real_template_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../template.yaml")
}

/// The repository's template, loaded as the local stack loads it (default parameters), for
/// unit tests.
#[cfg(test)]
pub(crate) fn real_template() -> Template {
    Template::load(
        &real_template_path(),
        "longhaul",
        "http://127.0.0.1:1",
        "http://127.0.0.1:2",
        &BTreeMap::new(),
    )
    .unwrap()
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
        let t = real_template();
        for (logical, _) in t.of_type("AWS::Serverless::Function") {
            let env = t.function_environment(logical).unwrap();
            assert!(env.contains_key("TABLE_NAME"), "{logical}");
        }
        assert_eq!(t.reference("JobsTable").unwrap(), "longhaul-JobsTable");
        // The schedules' EventBridge Scheduler group and the role its schedules send as.
        let env = t.function_environment("SchedulesFunction").unwrap();
        assert_eq!(env["SCHEDULE_GROUP"], "longhaul-schedules");
        assert_eq!(
            env["SCHEDULER_ROLE_ARN"],
            "arn:aws:iam::123456789012:role/longhaul-SchedulerRole"
        );
        assert_eq!(
            t.attribute("ScheduleGroup", "Arn").unwrap(),
            "arn:aws:scheduler:us-east-1:123456789012:schedule-group/longhaul-schedules"
        );
    }

    /// `sam build` builds once for every function whose Metadata (and code, runtime,
    /// architecture, handler) is the same, and copies the artifact to the others: one
    /// Metadata, word for word, on every function keeps the build to one cargo-lambda run
    /// of the one binary that every function deploys.
    #[test]
    fn every_function_shares_one_build() {
        let t = real_template();
        let functions: Vec<_> = t.of_type("AWS::Serverless::Function").collect();
        assert!(functions.len() > 10, "{} functions", functions.len());
        let (first, first_function) = functions[0];
        let metadata = &first_function["Metadata"];
        assert_eq!(metadata["BuildMethod"], "rust-cargolambda", "{first}");
        assert_eq!(metadata["BuildProperties"]["Binary"], "longhaul-lambda", "{first}");
        for (logical, function) in functions {
            assert_eq!(&function["Metadata"], metadata, "{logical}'s Metadata is not {first}'s");
            for property in ["CodeUri", "Runtime", "Handler", "Architectures"] {
                assert!(
                    function["Properties"].get(property).is_none(),
                    "{logical} sets {property} of its own (the Globals' is every function's)"
                );
            }
        }
    }

    /// No function's environment carries a secret's value (a dynamic reference would put it
    /// there in plain text for anyone who may read the function's configuration): functions
    /// are given secrets' ARNs and read the values at init.
    #[test]
    fn no_function_environment_resolves_a_secret() {
        let text = std::fs::read_to_string(real_template_path()).unwrap();
        assert!(!text.contains("{{resolve:secretsmanager"), "a secret resolved into the template");
        let t = real_template();
        let env = t.function_environment("EventsFunction").unwrap();
        assert_eq!(env["STREAM_TOKEN_SECRET_ARN"], secret_arn("longhaul-StreamTokenSecret"));
    }

    /// The deployment's cap on open streams stays below the events function's reservation,
    /// so a stream past it is our 429, never Lambda's throttle for every principal alike.
    #[test]
    fn the_deployments_stream_cap_is_below_the_events_reservation() {
        let t = real_template();
        let number = |name: &str| t.parameters[name].parse::<u64>().unwrap();
        let (cap, reserved) = (number("MaxStreams"), number("EventsReservedConcurrency"));
        assert!(
            0 < cap && cap < reserved,
            "MaxStreams {cap} vs EventsReservedConcurrency {reserved}"
        );
        let env = t.function_environment("EventsFunction").unwrap();
        assert_eq!(env["LONGHAUL_MAX_STREAMS"], cap.to_string());
    }

    /// The concurrency budget (template.yaml, by its Parameters; docs/runbook.md): with the
    /// template's defaults, the reservations leave AWS's unreserved minimum and what the
    /// functions without a reservation need, counted one by one from their triggers, within a
    /// default account's 1,000 executions. Every worker function reserves, above the
    /// `concurrency_limit` of each kind it runs; every other function must be counted here.
    #[test]
    fn the_reservations_leave_the_api_and_background_functions_their_share() {
        /// A default account's concurrent executions (a quota raise is per account).
        const ACCOUNT_LIMIT: u64 = 1_000;
        /// What AWS keeps unreserved, shared by every function in the account: not ours.
        const UNRESERVED_MINIMUM: u64 = 100;
        /// Seconds an API request holds a function, generously (warm: a few AWS calls).
        const API_SECONDS_PER_REQUEST: f64 = 0.1;
        /// Shards of the job table's stream counted per stream function (one per partition).
        const STREAM_SHARDS: u64 = 10;

        let path = real_template_path();
        let t = real_template();
        let doc =
            yaml_to_json(serde_norway::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap())
                .unwrap();
        let conditions = &doc["Conditions"];
        let number = |v: &Value| -> u64 { t.resolve_string(v).unwrap().parse().unwrap() };

        let mut reserved = BTreeMap::new();
        let mut needs: BTreeMap<String, u64> = BTreeMap::new();
        let mut api = Vec::new();
        for (logical, function) in t.of_type("AWS::Serverless::Function") {
            let props = &function["Properties"];
            if let Some(n) = reservation(&t, conditions, &props["ReservedConcurrentExecutions"]) {
                reserved.insert(logical.clone(), n);
                continue;
            }
            let events: Vec<&Value> =
                props["Events"].as_object().into_iter().flat_map(|e| e.values()).collect();
            assert!(!events.is_empty(), "{logical}: no reservation and no trigger to count");
            for event in events {
                let ep = &event["Properties"];
                let need = match event["Type"].as_str().unwrap() {
                    // Counted once for every function behind the API, below.
                    "HttpApi" => {
                        api.push(logical.clone());
                        continue;
                    }
                    // Without a maximum, SQS scales a mapping up to 1,250 invocations.
                    "SQS" => {
                        let max = &ep["ScalingConfig"]["MaximumConcurrency"];
                        assert!(
                            !max.is_null(),
                            "{logical}: its SQS mapping needs a MaximumConcurrency"
                        );
                        number(max)
                    }
                    "DynamoDB" => {
                        let factor = &ep["ParallelizationFactor"];
                        STREAM_SHARDS * if factor.is_null() { 1 } else { number(factor) }
                    }
                    "Schedule" => {
                        let every = crate::stack::model::parse_rate(
                            &t.resolve_string(&ep["Schedule"]).unwrap(),
                        )
                        .unwrap_or_else(|| panic!("{logical}: a rate() schedule"));
                        t.function_timeout(logical).unwrap().div_ceil(every.as_secs().max(1))
                    }
                    other => panic!("{logical}: count what a {other} trigger needs"),
                };
                *needs.entry(logical.clone()).or_default() += need;
            }
        }
        let rate = number(&json!({"Ref": "ApiThrottlingRateLimit"}));
        let burst = number(&json!({"Ref": "ApiThrottlingBurstLimit"}));
        let api_need = (rate.max(burst) as f64 * API_SECONDS_PER_REQUEST).ceil() as u64;
        api.sort();
        api.dedup();
        assert!(api.len() >= 6, "{api:?}");
        needs.insert(format!("the API ({})", api.join(", ")), api_need);

        // The worker functions (the dispatcher's LONGHAUL_WORKERS) all reserve, and above the
        // concurrency_limit of every kind they run: that limit, not the reservation, is what
        // the dispatcher holds jobs to.
        let workers: BTreeMap<String, String> = serde_json::from_str(
            &t.function_environment("DispatcherFunction").unwrap()["LONGHAUL_WORKERS"],
        )
        .unwrap();
        assert_eq!(
            t.function_environment("ReaperFunction").unwrap()["LONGHAUL_WORKERS"],
            t.function_environment("DispatcherFunction").unwrap()["LONGHAUL_WORKERS"]
        );
        for worker in workers.keys() {
            assert!(reserved.contains_key(worker), "worker {worker} reserves no concurrency");
        }
        for kind in longhaul_jobs::registry().kinds() {
            let policy = kind.policy();
            assert!(workers.contains_key(policy.worker), "{}: {}", kind.name(), policy.worker);
            if policy.worker != longhaul_worker::SHARED_WORKER {
                let limit = policy.concurrency_limit.unwrap_or_else(|| {
                    panic!("{} has its own worker and no concurrency_limit", kind.name())
                });
                assert!(
                    u64::from(limit) < reserved[policy.worker],
                    "{}: concurrency_limit {limit} ≥ {}'s reservation {}",
                    kind.name(),
                    policy.worker,
                    reserved[policy.worker]
                );
            }
        }

        let total_reserved: u64 = reserved.values().sum();
        let total_needs: u64 = needs.values().sum();
        assert!(
            total_reserved + UNRESERVED_MINIMUM + total_needs <= ACCOUNT_LIMIT,
            "reserved {total_reserved} {reserved:?} + AWS's unreserved {UNRESERVED_MINIMUM} \
             + needed {total_needs} {needs:?} > {ACCOUNT_LIMIT}"
        );
        // The figures the template's comment and the runbook give.
        assert_eq!((total_reserved, total_needs), (560, 299), "{reserved:?} {needs:?}");
    }

    /// A function's `ReservedConcurrentExecutions` with the parameters' defaults: a number, a
    /// parameter, or `Fn::If` on a condition of `Fn::Not`/`Fn::Equals` (0 = none).
    fn reservation(t: &Template, conditions: &Value, value: &Value) -> Option<u64> {
        fn holds(t: &Template, conditions: &Value, c: &Value) -> bool {
            if let Some(name) = c["Condition"].as_str() {
                return holds(t, conditions, &conditions[name]);
            }
            if let Some([inner]) = c["Fn::Not"].as_array().map(Vec::as_slice) {
                return !holds(t, conditions, inner);
            }
            if let Some([a, b]) = c["Fn::Equals"].as_array().map(Vec::as_slice) {
                return t.resolve_string(a).unwrap() == t.resolve_string(b).unwrap();
            }
            panic!("condition {c} not understood")
        }
        match value {
            Value::Null => None,
            Value::Object(map) if map.contains_key("Fn::If") => {
                let [condition, then, otherwise] = map["Fn::If"].as_array().unwrap().as_slice()
                else {
                    panic!("Fn::If needs three arguments")
                };
                let name = condition.as_str().unwrap();
                let chosen = if holds(t, conditions, &conditions[name]) { then } else { otherwise };
                reservation(t, conditions, chosen)
            }
            Value::Object(map) if map.get("Ref").is_some_and(|r| r == "AWS::NoValue") => None,
            other => Some(t.resolve_string(other).unwrap().parse().unwrap()).filter(|n| *n > 0),
        }
    }
}
