//! `upload`: `POST /uploads`, then the presigned `PUT` of the file with a byte progress bar.

use std::path::Path;

use futures::StreamExt;
use reqwest::Method;
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;

use crate::api::Api;
use crate::cli::Upload;
use crate::error::{CliError, Exit};
use crate::output::Output;
use crate::problem::Problem;

/// Bytes read from the file per chunk of the upload.
const CHUNK: usize = 256 * 1024;

/// A media type for `path` from its extension (`application/octet-stream` when unknown).
pub fn content_type_for(path: &Path) -> String {
    mime_guess::from_path(path).first_or_octet_stream().essence_str().to_owned()
}

/// Uploads `args.file`; prints the `input` to name in a job's params (text) or
/// `{"input", "filename", "size_bytes", "expires_at"}` (JSON).
pub async fn upload(api: &Api, out: &Output, args: &Upload) -> Result<Exit, CliError> {
    let path = &args.file;
    let shown = path.display().to_string();
    let meta =
        tokio::fs::metadata(path).await.map_err(|e| CliError::Usage(format!("{shown}: {e}")))?;
    if !meta.is_file() {
        return Err(CliError::Usage(format!("{shown}: not a regular file")));
    }
    let size = meta.len();
    let filename = path.file_name().and_then(|n| n.to_str()).unwrap_or("upload").to_owned();
    let content_type = args.content_type.clone().unwrap_or_else(|| content_type_for(path));
    let request = json!({"filename": filename, "content_type": content_type, "size_bytes": size});
    let grant = api.post("/uploads", &request).await?.body;
    let field = |name: &str| {
        grant
            .get(name)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| CliError::Protocol(format!("POST /uploads answered without {name}")))
    };
    let (url, input) = (field("upload_url")?, field("input")?);
    let method = grant.get("method").and_then(Value::as_str).unwrap_or("PUT");
    let method = Method::from_bytes(method.as_bytes())
        .map_err(|_| CliError::Protocol(format!("POST /uploads named method {method:?}")))?;

    let file =
        tokio::fs::File::open(path).await.map_err(|e| CliError::Usage(format!("{shown}: {e}")))?;
    let bar = out.byte_bar(size, &filename);
    let progress = bar.clone();
    let chunks = futures::stream::try_unfold(file, |mut file| async move {
        let mut buf = vec![0u8; CHUNK];
        let n = file.read(&mut buf).await?;
        buf.truncate(n);
        Ok::<_, std::io::Error>((n > 0).then_some((buf, file)))
    })
    .inspect(move |chunk| {
        if let Ok(chunk) = chunk {
            progress.inc(chunk.len() as u64);
        }
    });
    // No bearer token here: the URL is presigned. The signed size must match exactly.
    let mut put = api
        .http()
        .request(method, &url)
        .header(reqwest::header::CONTENT_LENGTH, size)
        .body(reqwest::Body::wrap_stream(chunks));
    for (name, value) in grant.get("headers").and_then(Value::as_object).into_iter().flatten() {
        if let Some(value) = value.as_str() {
            put = put.header(name.as_str(), value);
        }
    }
    let response = put.send().await.map_err(CliError::transport(format!("uploading {shown}")))?;
    let status = response.status();
    if !status.is_success() {
        bar.abandon();
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = response.bytes().await.unwrap_or_default();
        let mut problem = Problem::from_answer(status.as_u16(), content_type.as_deref(), &body);
        problem.detail = Some("the storage refused the upload".into());
        return Err(CliError::Api(Box::new(problem)));
    }
    bar.finish();
    let document = json!({
        "input": input,
        "filename": filename,
        "size_bytes": size,
        "expires_at": grant.get("expires_at"),
    });
    out.print(&document, || input.clone());
    Ok(Exit::Ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn media_types_follow_the_extension() {
        assert_eq!(content_type_for(Path::new("a/b.CSV")), "text/csv");
        assert_eq!(content_type_for(Path::new("x.bin")), "application/octet-stream");
        assert_eq!(content_type_for(Path::new("noext")), "application/octet-stream");
    }
}
