//! The OpenAI Batch API file format: JSONL lines `{"custom_id", "method", "url", "body"}`
//! in, one output line per input line (in input order) out. A bad line becomes an error
//! record for that line; the rest of the batch completes.

use super::chat::{ChatFrontend, PreparedChat};
use super::engine::{Engine, EngineError, StreamEvent};
use super::request::{Output, RequestId};
use deepinfer_kernels::Backend;
use serde_json::{Value, json};
use std::collections::HashMap;

/// The built-in sample batch of `deepinfer generate` (no `--input`).
pub const SAMPLE_BATCH: &str = include_str!("sample_batch.jsonl");

/// Totals of one batch run.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BatchSummary {
    /// Non-empty input lines.
    pub lines: usize,
    /// Lines answered with a completion.
    pub completed: usize,
    /// Lines answered with an error record.
    pub errors: usize,
    /// Prompt tokens of the completed lines.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub generated_tokens: usize,
    /// Wall time of the generation, seconds.
    pub elapsed_s: f64,
}

fn error_record(
    line: usize,
    custom_id: Option<&str>,
    code: &str,
    message: &str,
    body: Option<Value>,
) -> Value {
    json!({
        "id": format!("batch_req_{line}"),
        "custom_id": custom_id,
        "response": body.map(|b| json!({"status_code": 400, "request_id": format!("req_{line}"), "body": b})),
        "error": {"code": code, "message": message, "line": line},
    })
}

/// Check one input line; `Ok` holds its custom id and body.
fn parse_line(text: &str) -> Result<(String, Value), (Option<String>, &'static str, String)> {
    let v: Value = serde_json::from_str(text)
        .map_err(|e| (None, "invalid_json", format!("line is not JSON: {e}")))?;
    let cid = v
        .get("custom_id")
        .and_then(Value::as_str)
        .map(str::to_string);
    let Some(id) = cid.clone() else {
        return Err((
            None,
            "missing_custom_id",
            "line has no string `custom_id`".into(),
        ));
    };
    if let Some(url) = v.get("url").and_then(Value::as_str)
        && url != "/v1/chat/completions"
    {
        return Err((
            cid,
            "unsupported_url",
            format!("url `{url}` is not /v1/chat/completions"),
        ));
    }
    match v.get("body") {
        Some(b @ Value::Object(_)) => Ok((id, b.clone())),
        _ => Err((cid, "missing_body", "line has no object `body`".into())),
    }
}

/// Run a batch file's text through `engine`, returning one output line (JSON) per non-empty
/// input line, in order. `on_done(requests_done, requests_total, tokens)` reports progress.
pub fn run_batch<B: Backend>(
    engine: &mut Engine<B>,
    front: &ChatFrontend,
    input: &str,
    default_seed: u64,
    mut on_done: impl FnMut(usize, usize, usize),
) -> Result<(Vec<Value>, BatchSummary), EngineError>
where
    B::Tensor: Clone,
{
    let mut sum = BatchSummary::default();
    let mut records: Vec<Option<Value>> = Vec::new();
    let mut jobs: Vec<(usize, usize, String, PreparedChat)> = Vec::new();
    let mut next_id: RequestId = 0;
    for (i, text) in input.lines().enumerate() {
        if text.trim().is_empty() {
            continue;
        }
        let line = i + 1;
        sum.lines += 1;
        let slot = records.len();
        records.push(None);
        match parse_line(text) {
            Err((cid, code, msg)) => {
                records[slot] = Some(error_record(line, cid.as_deref(), code, &msg, None))
            }
            Ok((cid, body)) => match front.prepare(&body, next_id, default_seed ^ line as u64) {
                Err(e) => {
                    records[slot] = Some(error_record(
                        line,
                        Some(&cid),
                        "invalid_request",
                        &e.to_string(),
                        Some(e.to_json()),
                    ))
                }
                Ok(prep) => {
                    let bad = prep
                        .requests
                        .iter()
                        .find_map(|r| engine.check_request(r).err());
                    if let Some(e) = bad {
                        records[slot] = Some(error_record(
                            line,
                            Some(&cid),
                            "invalid_request",
                            &e.to_string(),
                            None,
                        ));
                    } else {
                        next_id += prep.requests.len() as u64;
                        jobs.push((slot, line, cid, prep));
                    }
                }
            },
        }
    }
    let requests: Vec<_> = jobs
        .iter()
        .flat_map(|(_, _, _, p)| p.requests.iter().cloned())
        .collect();
    let total: usize = requests.iter().map(|r| r.params.n.max(1)).sum();
    let mut outputs: HashMap<RequestId, Vec<Output>> = HashMap::new();
    let mut finished = 0usize;
    let mut tokens = 0usize;
    let t0 = std::time::Instant::now();
    engine.generate_stream(requests, |ev| {
        match ev {
            StreamEvent::Token { .. } => tokens += 1,
            StreamEvent::Finished(o) => {
                outputs.entry(o.id).or_default().push((**o).clone());
                finished += 1;
                on_done(finished, total, tokens);
            }
            _ => {}
        }
        true
    })?;
    sum.elapsed_s = t0.elapsed().as_secs_f64();
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    for (slot, line, cid, prep) in jobs {
        let mut outs: Vec<Output> = prep
            .requests
            .iter()
            .filter_map(|r| outputs.remove(&r.id))
            .flatten()
            .collect();
        outs.sort_by_key(|o| (o.id, o.index));
        sum.completed += 1;
        sum.prompt_tokens += prep.prompt_tokens;
        sum.generated_tokens += outs
            .iter()
            .map(|o| o.usage.completion_tokens)
            .sum::<usize>();
        let body = front.response_json(&prep, &outs, &format!("chatcmpl-{line}"), created);
        records[slot] = Some(json!({
            "id": format!("batch_req_{line}"),
            "custom_id": cid,
            "response": {"status_code": 200, "request_id": format!("req_{line}"), "body": body},
            "error": null,
        }));
    }
    sum.errors = sum.lines - sum.completed;
    Ok((records.into_iter().flatten().collect(), sum))
}
