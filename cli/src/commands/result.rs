//! `result`: `GET /jobs/{id}/result`, then the `303`'s link (a presigned URL, or the API's
//! own link of a small result), with a download bar.

use futures::StreamExt;
use reqwest::{StatusCode, header};
use serde_json::json;
use tokio::io::AsyncWriteExt;

use crate::api::Api;
use crate::cli::ResultArgs;
use crate::error::{CliError, Exit};
use crate::output::Output;
use crate::problem::Problem;

/// Downloads the result to `-o FILE` (or stdout). With `--json` and `-o`, prints
/// `{"job_id", "file", "bytes"}`; `--json` without `-o` is a usage error (stdout is the data).
pub async fn result(api: &Api, out: &Output, args: &ResultArgs) -> Result<Exit, CliError> {
    if out.json && args.output.is_none() {
        return Err(CliError::Usage(
            "--json needs -o FILE: without it stdout is the result".into(),
        ));
    }
    let path = format!("/jobs/{}/result", args.id);
    let what = format!("GET {path}");
    let response = api
        .request(reqwest::Method::GET, &path)
        .send()
        .await
        .map_err(CliError::transport(&what))?;
    let status = response.status();
    if status != StatusCode::SEE_OTHER {
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = response.bytes().await.map_err(CliError::transport(&what))?;
        let mut problem = Problem::from_answer(status.as_u16(), content_type.as_deref(), &body);
        if status.is_success() {
            problem.detail = Some("expected a 303 redirect to the result".into());
        }
        if status == StatusCode::GONE && problem.detail.is_none() {
            problem.detail = Some(format!("job {}'s result has expired and was deleted", args.id));
        }
        return Err(CliError::Api(Box::new(problem)));
    }
    let location = response
        .headers()
        .get(header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| CliError::Protocol("the 303 has no Location".into()))?
        .to_owned();
    // Resolved against the request's URL, as a browser does: a small result's link is
    // relative to it, which holds behind a path prefix too.
    let target =
        reqwest::Url::parse(&api.url(&path))
            .and_then(|request| request.join(&location))
            .map_err(|e| CliError::Protocol(format!("the 303's Location is not a URL: {e}")))?;
    // The link authorises itself: no bearer token goes with it.
    let download = api
        .http()
        .get(target)
        .send()
        .await
        .map_err(CliError::transport("downloading the result"))?;
    if !download.status().is_success() {
        let mut problem = Problem::from_answer(download.status().as_u16(), None, b"");
        problem.detail = Some("the storage refused the download".into());
        return Err(CliError::Api(Box::new(problem)));
    }
    let total = download.content_length();
    let bar = out.byte_bar(total.unwrap_or(0), "result");
    let mut sink: Box<dyn tokio::io::AsyncWrite + Unpin + Send> = match &args.output {
        Some(file) => Box::new(
            tokio::fs::File::create(file)
                .await
                .map_err(CliError::io(format!("creating {}", file.display())))?,
        ),
        None => Box::new(tokio::io::stdout()),
    };
    let mut written: u64 = 0;
    let mut chunks = download.bytes_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(CliError::transport("downloading the result"))?;
        sink.write_all(&chunk).await.map_err(CliError::io("writing the result"))?;
        written += chunk.len() as u64;
        bar.set_position(written);
    }
    sink.flush().await.map_err(CliError::io("writing the result"))?;
    if let Some(file) = &args.output {
        // The file is complete on disk before success is reported.
        drop(sink);
        bar.finish();
        let document =
            json!({"job_id": args.id, "file": file.display().to_string(), "bytes": written});
        out.print(&document, || format!("wrote {written} bytes to {}", file.display()));
    } else {
        bar.finish_and_clear();
    }
    Ok(Exit::Ok)
}
