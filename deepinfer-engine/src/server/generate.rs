//! The generation routes: Chat Completions, Responses, Messages and legacy completions.
//! Each converts its body into one engine request, submits it, and answers with the
//! complete body or a stream of server-sent events.

use super::render::Render;
use super::sink::{self, Progress, Tracker};
use super::{ApiError, AppState, read_json, unix_now};
use crate::runtime::{EngineError, GenParams, OnlineEngine, Request, RequestId, SubmitError};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use deepinfer_recipe::SpecialToken;
use deepinfer_recipe::protocol::anthropic::MessagesStream;
use deepinfer_recipe::protocol::responses::ResponsesStream;
use deepinfer_recipe::protocol::{ParsingOptions, Protocol};
use deepinfer_sample::SamplingParams;
use serde_json::Value;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// `POST /v1/chat/completions`.
pub(crate) async fn chat(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    protocol_request(st, Protocol::ChatCompletions, headers, body).await
}

/// `POST /v1/responses`.
pub(crate) async fn responses(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    protocol_request(st, Protocol::Responses, headers, body).await
}

/// `POST /v1/messages` (Anthropic).
pub(crate) async fn messages(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    protocol_request(st, Protocol::AnthropicMessages, headers, body).await
}

/// A chat-style body: converted by the recipe crate (off the async threads: encoding and
/// grammar compilation take CPU time), submitted, answered.
async fn protocol_request(
    st: Arc<AppState>,
    protocol: Protocol,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let arrived = Instant::now();
    let body = match read_json(&headers, body, st.cfg.max_body_bytes, protocol).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let front = st.front.clone();
    let seed = st.next_seed();
    let prep =
        tokio::task::spawn_blocking(move || front.prepare_as(protocol, &body, 0, seed)).await;
    let prep = match prep {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => {
            return ApiError::with_body(StatusCode::BAD_REQUEST, e.to_json_for(protocol))
                .into_response();
        }
        Err(e) => {
            return ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, protocol, e.to_string())
                .into_response();
        }
    };
    let Some(request) = prep.requests.first().cloned() else {
        return ApiError::bad_request(protocol, "nothing to generate").into_response();
    };
    let created = unix_now();
    let stream = prep.stream;
    let render = match protocol {
        Protocol::ChatCompletions => Render::chat(prep, st.next_id("chatcmpl-"), created),
        Protocol::Responses => Render::Responses(
            Box::new(ResponsesStream::new(
                st.next_id("resp_"),
                prep.model.clone(),
                prep.thinking,
            )),
            prep.prompt_tokens,
        ),
        Protocol::AnthropicMessages => Render::Messages(
            Box::new(MessagesStream::new(
                st.next_id("msg_"),
                prep.model.clone(),
                prep.thinking,
            )),
            prep.prompt_tokens,
        ),
    };
    if request.params.n > 1 && protocol != Protocol::ChatCompletions {
        return ApiError::bad_request(protocol, "n > 1 is only supported by chat completions")
            .into_response();
    }
    run(st, protocol, request, stream, render, arrived).await
}

/// Submit `request` and answer it: the complete body, or a stream.
async fn run(
    st: Arc<AppState>,
    protocol: Protocol,
    request: Request,
    stream: bool,
    mut render: Render,
    arrived: Instant,
) -> Response {
    let (sink, rx) = sink::channel();
    let samples = request.params.n.max(1);
    let want_logprobs = request.params.logprobs;
    let id = match st.online.submit(request, Box::new(sink)) {
        Ok(id) => id,
        Err(e) => return submit_error(protocol, e).into_response(),
    };
    let guard = AbortOnDrop {
        online: st.online.clone(),
        id,
        armed: true,
    };
    let mut tracker = Tracker::new(rx, samples, want_logprobs, arrived, st.metrics.clone());
    let tok = st.front.tokenizer().clone();
    if !stream {
        let mut guard = guard;
        loop {
            match tracker.next().await {
                Progress::Parsed {
                    index,
                    event,
                    logprobs,
                } => {
                    if render.completes_from_events() {
                        render.event(&tok, index, &event, &logprobs);
                    }
                }
                Progress::Done(outs) => {
                    guard.armed = false;
                    return axum::Json(render.complete(&st.front, &outs)).into_response();
                }
                Progress::Failed(m) => {
                    guard.armed = false;
                    return ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, protocol, m)
                        .into_response();
                }
            }
        }
    }
    let (tx, body_rx) = mpsc::channel::<Result<Bytes, Infallible>>(64);
    tokio::spawn(async move {
        let mut guard = guard;
        let mut frames = render.start();
        loop {
            for f in frames.drain(..) {
                if tx.send(Ok(Bytes::from(f))).await.is_err() {
                    return; // the client went away: the guard aborts the request
                }
            }
            let p = tokio::select! {
                p = tracker.next() => p,
                () = tx.closed() => return,
            };
            match p {
                Progress::Parsed {
                    index,
                    event,
                    logprobs,
                } => frames = render.event(&tok, index, &event, &logprobs),
                Progress::Done(outs) => {
                    guard.armed = false;
                    for f in render.finish(&outs) {
                        let _ = tx.send(Ok(Bytes::from(f))).await;
                    }
                    return;
                }
                Progress::Failed(m) => {
                    guard.armed = false;
                    let e = ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, protocol, m);
                    let frame = match protocol {
                        Protocol::AnthropicMessages => {
                            format!("event: error\ndata: {}\n\n", e.body)
                        }
                        _ => format!("data: {}\n\n", e.body),
                    };
                    let _ = tx.send(Ok(Bytes::from(frame))).await;
                    return;
                }
            }
        }
    });
    let mut resp = Body::from_stream(ReceiverStream::new(body_rx)).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

/// Aborts its request when dropped before the request finished (client disconnects).
struct AbortOnDrop {
    online: Arc<OnlineEngine>,
    id: RequestId,
    armed: bool,
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if self.armed {
            self.online.abort(self.id);
        }
    }
}

fn submit_error(protocol: Protocol, e: SubmitError) -> ApiError {
    match e {
        SubmitError::QueueFull(_) => {
            ApiError::new(StatusCode::TOO_MANY_REQUESTS, protocol, e.to_string())
        }
        SubmitError::Closed => {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, protocol, e.to_string())
        }
        SubmitError::Invalid(EngineError::InvalidRequest { reason, .. }) => {
            ApiError::bad_request(protocol, reason)
        }
        SubmitError::Invalid(e) => ApiError::bad_request(protocol, e.to_string()),
    }
}

/// `POST /v1/completions`: a text prompt (or token ids), no chat template.
pub(crate) async fn completions(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let arrived = Instant::now();
    let protocol = Protocol::ChatCompletions;
    let body = match read_json(&headers, body, st.cfg.max_body_bytes, protocol).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let (request, stream, include_usage) = match completion_request(&st, &body) {
        Ok(r) => r,
        Err(m) => return ApiError::bad_request(protocol, m).into_response(),
    };
    let render = Render::Completion {
        id: st.next_id("cmpl-"),
        model: body
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or(&st.cfg.model_name)
            .to_string(),
        created: unix_now(),
        prompt_tokens: request.prompt.len(),
        include_usage,
    };
    run(st, protocol, request, stream, render, arrived).await
}

/// A typed field: absent is `None`, a wrong type an error naming the field.
fn field<'a, T>(
    body: &'a Value,
    key: &str,
    what: &str,
    get: impl FnOnce(&'a Value) -> Option<T>,
) -> Result<Option<T>, String> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => get(v)
            .map(Some)
            .ok_or_else(|| format!("'{key}' must be {what}")),
    }
}

fn number(body: &Value, key: &str) -> Result<Option<f32>, String> {
    field(body, key, "a number", |v| v.as_f64().map(|x| x as f32))
}

fn count(body: &Value, key: &str) -> Result<Option<u64>, String> {
    field(body, key, "a non-negative integer", Value::as_u64)
}

/// The engine request of a completions body, whether it streams, and whether the stream
/// ends with usage.
fn completion_request(st: &AppState, body: &Value) -> Result<(Request, bool, bool), String> {
    let tok = st.front.tokenizer();
    let prompt: Vec<u32> = match body.get("prompt") {
        Some(Value::String(s)) => {
            let mut ids: Vec<u32> = tok
                .special_id(SpecialToken::Bos.deepseek_spelling())
                .into_iter()
                .collect();
            tok.encode_plain_into(s, &mut ids)
                .map_err(|e| format!("cannot encode the prompt: {e}"))?;
            ids
        }
        Some(Value::Array(a)) if a.iter().all(Value::is_u64) && !a.is_empty() => a
            .iter()
            .map(|v| v.as_u64().and_then(|t| u32::try_from(t).ok()))
            .collect::<Option<Vec<u32>>>()
            .ok_or("token ids must fit in 32 bits")?,
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
            return completion_request(st, &{
                let mut b = body.clone();
                b["prompt"] = a[0].clone();
                b
            });
        }
        Some(Value::Array(_)) => {
            return Err(
                "'prompt' must be a string, one string in a list, or a list of token ids".into(),
            );
        }
        None => return Err("'prompt' is required".into()),
        Some(_) => return Err("'prompt' must be a string or a list of token ids".into()),
    };
    let stop_sequences = match body.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or("'stop' must be a string or a list of strings")?,
        Some(_) => return Err("'stop' must be a string or a list of strings".into()),
    };
    let top_logprobs = count(body, "logprobs")?;
    let sampling = SamplingParams {
        temperature: number(body, "temperature")?.unwrap_or(1.0),
        top_p: number(body, "top_p")?.unwrap_or(1.0),
        top_k: count(body, "top_k")?.unwrap_or(0) as u32,
        min_p: number(body, "min_p")?.unwrap_or(0.0),
        repetition_penalty: number(body, "repetition_penalty")?.unwrap_or(1.0),
        presence_penalty: number(body, "presence_penalty")?.unwrap_or(0.0),
        frequency_penalty: number(body, "frequency_penalty")?.unwrap_or(0.0),
        seed: count(body, "seed")?.unwrap_or_else(|| st.next_seed()),
        top_logprobs: top_logprobs.unwrap_or(0) as usize,
        ..SamplingParams::default()
    };
    sampling.validate().map_err(|e| e.to_string())?;
    let stream = field(body, "stream", "a boolean", Value::as_bool)?.unwrap_or(false);
    let include_usage = body
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let ignore_eos = field(body, "ignore_eos", "a boolean", Value::as_bool)?.unwrap_or(false);
    let params = GenParams {
        sampling,
        stop_at_eos: !ignore_eos,
        max_tokens: count(body, "max_tokens")?.unwrap_or(16) as usize,
        logprobs: top_logprobs.is_some(),
        n: count(body, "n")?.unwrap_or(1).max(1) as usize,
        ..GenParams::default()
    };
    if params.n > 16 {
        return Err("'n' must be at most 16".into());
    }
    let mut request = Request::new(0, prompt, params);
    request.parsing = Some(ParsingOptions {
        parse_tool_calls: false,
        starts_in_tool_calls: false,
        parse_json_output: false,
        thinking: None,
        stop_sequences,
    });
    Ok((request, stream, include_usage))
}
