//! Creates the template's tables, queues, buckets, secrets, EventBridge Scheduler schedule
//! groups and state machines in the emulator.
//! Idempotent: a restarted stack adopts what exists (and updates state machine definitions).

use anyhow::{Context, anyhow, bail};
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection,
    ProjectionType, ScalarAttributeType, StreamSpecification, StreamViewType,
    TimeToLiveSpecification,
};
use aws_sdk_sqs::types::QueueAttributeName;
use serde_json::Value;

use crate::stack::template::{ACCOUNT, Template};

/// SDK clients that talk to the emulator directly.
pub struct Clients {
    /// DynamoDB.
    pub dynamodb: aws_sdk_dynamodb::Client,
    /// SQS.
    pub sqs: aws_sdk_sqs::Client,
    /// S3.
    pub s3: aws_sdk_s3::Client,
    /// Step Functions.
    pub sfn: aws_sdk_sfn::Client,
    /// Secrets Manager.
    pub secrets: aws_sdk_secretsmanager::Client,
    /// EventBridge Scheduler.
    pub scheduler: aws_sdk_scheduler::Client,
}

/// Creates every supported resource; warns about resource types the emulator has no use for.
pub async fn provision(template: &Template, clients: &Clients) -> anyhow::Result<()> {
    for (logical, resource) in &template.resources {
        let kind = resource["Type"].as_str().unwrap_or_default();
        let result = match kind {
            "AWS::DynamoDB::Table" => table(template, logical, resource, clients).await,
            "AWS::S3::Bucket" => bucket(template, logical, resource, clients).await,
            "AWS::SQS::Queue" => queue(template, logical, resource, clients, false).await,
            "AWS::SecretsManager::Secret" => secret(template, logical, resource, clients).await,
            "AWS::Scheduler::ScheduleGroup" => schedule_group(template, logical, clients).await,
            // Functions are hosted by the edge; the API is served by it; policies and the
            // rest have nothing to emulate (an `AWS::IAM::Role` is judged by the IAM check
            // from the template, never looked up in the emulator).
            _ => Ok(()),
        };
        result.with_context(|| format!("provisioning {logical} ({kind})"))?;
    }
    // Redrive policies name other queues: set them once every queue exists.
    for (logical, resource) in template.of_type("AWS::SQS::Queue") {
        queue(template, logical, resource, clients, true)
            .await
            .with_context(|| format!("redrive of {logical}"))?;
    }
    for (logical, resource) in template.of_type("AWS::Serverless::StateMachine") {
        state_machine(template, logical, resource, clients)
            .await
            .with_context(|| format!("provisioning {logical}"))?;
    }
    Ok(())
}

/// A resource's `Properties` with intrinsics resolved, and its physical name.
fn resolved(
    template: &Template,
    logical: &str,
    resource: &Value,
) -> anyhow::Result<(Value, String)> {
    Ok((template.resolve(&resource["Properties"])?, template.physical_name(logical)?))
}

/// A secret with a generated value (`GenerateSecretString`: its `PasswordLength` characters
/// from the OS RNG). A secret already in a running emulator is kept, so that tokens signed
/// before a restart of the functions still verify.
async fn secret(
    template: &Template,
    logical: &str,
    resource: &Value,
    clients: &Clients,
) -> anyhow::Result<()> {
    use base64::Engine as _;
    let (props, name) = resolved(template, logical, resource)?;
    let generate = &props["GenerateSecretString"];
    if !generate.is_object() {
        bail!("only secrets with GenerateSecretString are supported locally");
    }
    let length = generate["PasswordLength"].as_u64().unwrap_or(32) as usize;
    let mut bytes = vec![0u8; length];
    getrandom::fill(&mut bytes).map_err(|e| anyhow!("the OS RNG failed: {e}"))?;
    // URL-safe base64 without padding has no punctuation but '-' and '_'; replace those so
    // the value honours ExcludePunctuation, and cut it to the asked length.
    let value: String = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(&bytes)
        .chars()
        .map(|c| match c {
            '-' => 'A',
            '_' => 'z',
            c => c,
        })
        .take(length)
        .collect();
    match clients.secrets.create_secret().name(&name).secret_string(value).send().await {
        Ok(_) => Ok(()),
        Err(err) if err.as_service_error().is_some_and(|e| e.is_resource_exists_exception()) => {
            Ok(())
        }
        Err(err) => Err(anyhow!(
            "creating secret {name}: {}",
            aws_sdk_secretsmanager::error::DisplayErrorContext(err)
        )),
    }
}

/// A schedule group (the functions' schedules live in it; the local firer reads them there).
/// One already in a running emulator is kept with its schedules: moto's create would
/// replace it with an empty one.
async fn schedule_group(
    template: &Template,
    logical: &str,
    clients: &Clients,
) -> anyhow::Result<()> {
    let name = template.physical_name(logical)?;
    match clients.scheduler.get_schedule_group().name(&name).send().await {
        Ok(_) => return Ok(()),
        Err(err) if err.as_service_error().is_some_and(|e| e.is_resource_not_found_exception()) => {
        }
        Err(err) => return Err(aws_err(err)),
    }
    clients.scheduler.create_schedule_group().name(&name).send().await.map_err(aws_err)?;
    Ok(())
}

fn key_schema(value: &Value) -> anyhow::Result<Vec<KeySchemaElement>> {
    value
        .as_array()
        .ok_or_else(|| anyhow!("KeySchema must be a list"))?
        .iter()
        .map(|k| {
            Ok(KeySchemaElement::builder()
                .attribute_name(k["AttributeName"].as_str().unwrap_or_default())
                .key_type(KeyType::from(k["KeyType"].as_str().unwrap_or_default()))
                .build()?)
        })
        .collect()
}

async fn table(
    template: &Template,
    logical: &str,
    resource: &Value,
    clients: &Clients,
) -> anyhow::Result<()> {
    let (props, name) = resolved(template, logical, resource)?;
    let mut request = clients
        .dynamodb
        .create_table()
        .table_name(&name)
        .billing_mode(BillingMode::from(props["BillingMode"].as_str().unwrap_or("PAY_PER_REQUEST")))
        .set_key_schema(Some(key_schema(&props["KeySchema"])?));
    for attr in props["AttributeDefinitions"].as_array().into_iter().flatten() {
        request = request.attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(attr["AttributeName"].as_str().unwrap_or_default())
                .attribute_type(ScalarAttributeType::from(
                    attr["AttributeType"].as_str().unwrap_or_default(),
                ))
                .build()?,
        );
    }
    for gsi in props["GlobalSecondaryIndexes"].as_array().into_iter().flatten() {
        let mut projection = Projection::builder().projection_type(ProjectionType::from(
            gsi["Projection"]["ProjectionType"].as_str().unwrap_or("ALL"),
        ));
        for attr in gsi["Projection"]["NonKeyAttributes"].as_array().into_iter().flatten() {
            projection = projection.non_key_attributes(attr.as_str().unwrap_or_default());
        }
        request = request.global_secondary_indexes(
            GlobalSecondaryIndex::builder()
                .index_name(gsi["IndexName"].as_str().unwrap_or_default())
                .set_key_schema(Some(key_schema(&gsi["KeySchema"])?))
                .projection(projection.build())
                .build()?,
        );
    }
    let stream = stream_view_type(&props)?;
    if let Some(view) = &stream {
        request = request.stream_specification(
            StreamSpecification::builder()
                .stream_enabled(true)
                .stream_view_type(view.clone())
                .build()?,
        );
    }
    match request.send().await {
        Ok(_) => {}
        Err(err) if err.as_service_error().is_some_and(|e| e.is_resource_in_use_exception()) => {
            // Adopted from a running emulator: it may predate the template's stream.
            if let Some(view) = stream {
                ensure_stream(&name, view, clients).await?;
            }
            return Ok(());
        }
        Err(err) => return Err(aws_err(err)),
    }
    if let Some(ttl) = props["TimeToLiveSpecification"].as_object() {
        clients
            .dynamodb
            .update_time_to_live()
            .table_name(&name)
            .time_to_live_specification(
                TimeToLiveSpecification::builder()
                    .attribute_name(ttl["AttributeName"].as_str().unwrap_or_default())
                    .enabled(ttl["Enabled"].as_bool().unwrap_or(true))
                    .build()?,
            )
            .send()
            .await
            .map_err(aws_err)?;
    }
    Ok(())
}

/// The table's `StreamSpecification.StreamViewType`, if it has a stream.
fn stream_view_type(props: &Value) -> anyhow::Result<Option<StreamViewType>> {
    let spec = &props["StreamSpecification"];
    if spec.is_null() {
        return Ok(None);
    }
    match spec["StreamViewType"].as_str() {
        Some(view @ ("NEW_IMAGE" | "OLD_IMAGE" | "NEW_AND_OLD_IMAGES" | "KEYS_ONLY")) => {
            Ok(Some(StreamViewType::from(view)))
        }
        _ => bail!(
            "StreamSpecification.StreamViewType must be NEW_IMAGE, OLD_IMAGE, NEW_AND_OLD_IMAGES or KEYS_ONLY"
        ),
    }
}

/// Gives an existing table the stream the template declares, if it has none.
async fn ensure_stream(name: &str, view: StreamViewType, clients: &Clients) -> anyhow::Result<()> {
    let described =
        clients.dynamodb.describe_table().table_name(name).send().await.map_err(aws_err)?;
    let current = described
        .table()
        .and_then(|t| t.stream_specification())
        .filter(|s| s.stream_enabled())
        .and_then(|s| s.stream_view_type().cloned());
    match current {
        Some(current) if current == view => Ok(()),
        // The emulator cannot change a stream's view type (nor re-enable a disabled stream).
        Some(current) => bail!(
            "table {name} in the running emulator has a {current} stream, the template wants {view}: \
             stop the emulator (`make stop`) so the table is created anew"
        ),
        None => {
            tracing::info!(table = name, view = %view, "enabling the stream of a table adopted from the running emulator");
            clients
                .dynamodb
                .update_table()
                .table_name(name)
                .stream_specification(
                    StreamSpecification::builder()
                        .stream_enabled(true)
                        .stream_view_type(view)
                        .build()?,
                )
                .send()
                .await
                .map_err(aws_err)
                .with_context(|| {
                    format!("enabling the stream of {name} (or stop the emulator with `make stop`)")
                })?;
            Ok(())
        }
    }
}

async fn bucket(
    template: &Template,
    logical: &str,
    resource: &Value,
    clients: &Clients,
) -> anyhow::Result<()> {
    let name = template.physical_name(logical)?;
    match clients.s3.create_bucket().bucket(&name).send().await {
        Ok(_) => {}
        Err(err) if err.as_service_error().is_some_and(|e| e.is_bucket_already_owned_by_you()) => {}
        Err(err) => return Err(aws_err(err)),
    }
    // Browsers PUT uploads and GET results through presigned URLs: the bucket's CORS rules
    // decide which origins may (the emulator answers preflights from them).
    let cors = &resource["Properties"]["CorsConfiguration"];
    if cors.is_null() {
        return Ok(());
    }
    let cors = template.resolve(cors)?;
    let rule_list = |rule: &Value, key: &str| -> Vec<String> {
        let cors = crate::stack::model::UrlCors::from_json(
            &serde_json::json!({"AllowOrigins": rule[key]}),
        );
        cors.allow_origins
    };
    let mut rules = Vec::new();
    for rule in cors["CorsRules"].as_array().cloned().unwrap_or_default() {
        rules.push(
            aws_sdk_s3::types::CorsRule::builder()
                .set_allowed_origins(Some(rule_list(&rule, "AllowedOrigins")))
                .set_allowed_methods(Some(rule_list(&rule, "AllowedMethods")))
                .set_allowed_headers(Some(rule_list(&rule, "AllowedHeaders")))
                .set_expose_headers(Some(rule_list(&rule, "ExposedHeaders")))
                .set_max_age_seconds(rule["MaxAge"].as_i64().map(|s| s as i32))
                .build()
                .context("CorsRules")?,
        );
    }
    clients
        .s3
        .put_bucket_cors()
        .bucket(&name)
        .cors_configuration(
            aws_sdk_s3::types::CorsConfiguration::builder()
                .set_cors_rules(Some(rules))
                .build()
                .context("CorsConfiguration")?,
        )
        .send()
        .await
        .map_err(aws_err)?;
    Ok(())
}

async fn queue(
    template: &Template,
    logical: &str,
    resource: &Value,
    clients: &Clients,
    redrive: bool,
) -> anyhow::Result<()> {
    let (props, name) = resolved(template, logical, resource)?;
    if redrive {
        if let Some(policy) = props.get("RedrivePolicy").filter(|p| !p.is_null()) {
            clients
                .sqs
                .set_queue_attributes()
                .queue_url(template.reference(logical)?)
                .attributes(QueueAttributeName::RedrivePolicy, policy.to_string())
                .send()
                .await
                .map_err(aws_err)?;
        }
        return Ok(());
    }
    let mut request = clients.sqs.create_queue().queue_name(&name);
    for (prop, attr) in [
        ("VisibilityTimeout", QueueAttributeName::VisibilityTimeout),
        ("MessageRetentionPeriod", QueueAttributeName::MessageRetentionPeriod),
        ("DelaySeconds", QueueAttributeName::DelaySeconds),
        ("MaximumMessageSize", QueueAttributeName::MaximumMessageSize),
        ("ReceiveMessageWaitTimeSeconds", QueueAttributeName::ReceiveMessageWaitTimeSeconds),
        ("FifoQueue", QueueAttributeName::FifoQueue),
        ("ContentBasedDeduplication", QueueAttributeName::ContentBasedDeduplication),
    ] {
        match &props[prop] {
            Value::Null => {}
            Value::String(s) => request = request.attributes(attr, s),
            other => request = request.attributes(attr, other.to_string()),
        }
    }
    match request.send().await {
        Ok(_) => Ok(()),
        // Exists with other attributes (the template changed): keep it, update them.
        Err(err) if err.as_service_error().is_some_and(|e| e.is_queue_name_exists()) => Ok(()),
        Err(err) => Err(aws_err(err)),
    }
}

async fn state_machine(
    template: &Template,
    logical: &str,
    resource: &Value,
    clients: &Clients,
) -> anyhow::Result<()> {
    let props = &resource["Properties"];
    let uri = props["DefinitionUri"]
        .as_str()
        .ok_or_else(|| anyhow!("{logical}: only a local DefinitionUri file is supported"))?;
    let path = template.dir.join(uri);
    let raw =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let substitutions = template.resolve(&props["DefinitionSubstitutions"])?;
    let definition = crate::stack::template::substitute(&raw, |name| {
        substitutions[name]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| anyhow!("DefinitionSubstitutions has no {name}"))
    })?;
    serde_json::from_str::<Value>(&definition)
        .with_context(|| format!("{} is not valid JSON after substitution", path.display()))?;
    let name = template.physical_name(logical)?;
    let arn = template.reference(logical)?;
    let role = format!("arn:aws:iam::{ACCOUNT}:role/{name}-role");
    let kind =
        aws_sdk_sfn::types::StateMachineType::from(props["Type"].as_str().unwrap_or("STANDARD"));
    let created = clients
        .sfn
        .create_state_machine()
        .name(&name)
        .definition(&definition)
        .role_arn(&role)
        .r#type(kind)
        .send()
        .await;
    match created {
        Ok(_) => Ok(()),
        Err(err) if err.as_service_error().is_some_and(|e| e.is_state_machine_already_exists()) => {
            clients
                .sfn
                .update_state_machine()
                .state_machine_arn(arn)
                .definition(definition)
                .send()
                .await
                .map_err(aws_err)?;
            Ok(())
        }
        Err(err) => Err(aws_err(err)),
    }
}

fn aws_err(err: impl std::error::Error + Send + Sync + 'static) -> anyhow::Error {
    anyhow::Error::new(longhaul_aws::AwsError::new("emulator", err))
}
