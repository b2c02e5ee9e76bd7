//! The routes around generation: models, health, metrics, tokenize and detokenize, and
//! the answers for unknown routes and methods.

use super::{ApiError, AppState, read_json};
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use deepinfer_recipe::SpecialToken;
use deepinfer_recipe::protocol::Protocol;
use serde_json::{Value, json};
use std::sync::Arc;

/// `GET /v1/models`: the one model, under the configured name.
pub(crate) async fn models(State(st): State<Arc<AppState>>) -> Response {
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": st.cfg.model_name,
            "object": "model",
            "created": st.started,
            "owned_by": "deepinfer",
        }],
    }))
    .into_response()
}

/// `GET /health`: 200 while the engine serves, 503 once it stopped or is draining.
pub(crate) async fn health(State(st): State<Arc<AppState>>) -> Response {
    if st.online.is_accepting() {
        StatusCode::OK.into_response()
    } else {
        StatusCode::SERVICE_UNAVAILABLE.into_response()
    }
}

/// `POST /reset_prefix_cache`: forget every cached prefix (as vLLM's endpoint of that name).
pub(crate) async fn reset_prefix_cache(State(st): State<Arc<AppState>>) -> Response {
    st.online.reset_prefix_cache();
    StatusCode::OK.into_response()
}

/// `GET /metrics`: Prometheus text.
pub(crate) async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    let text = st.metrics.render(&st.online.stats());
    let mut r = text.into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    r
}

/// `POST /tokenize`: `{"prompt": text, "add_special_tokens": bool}` (plain text, the BOS
/// token first unless `add_special_tokens` is false) or a chat body with `messages`
/// (rendered by the chat template) → `{"count", "max_model_len", "tokens"}`.
pub(crate) async fn tokenize(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let p = Protocol::ChatCompletions;
    let body = match read_json(&headers, body, st.cfg.max_body_bytes, p).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let tok = st.front.tokenizer().clone();
    let tokens: Vec<u32> = if body.get("messages").is_some() {
        let front = st.front.clone();
        match tokio::task::spawn_blocking(move || front.prepare(&body, 0, 0)).await {
            Ok(Ok(prep)) => prep
                .requests
                .first()
                .map(|r| r.prompt.clone())
                .unwrap_or_default(),
            Ok(Err(e)) => {
                return ApiError::with_body(StatusCode::BAD_REQUEST, e.to_json()).into_response();
            }
            Err(e) => {
                return ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, p, e.to_string())
                    .into_response();
            }
        }
    } else {
        let Some(text) = body.get("prompt").and_then(Value::as_str) else {
            return ApiError::bad_request(p, "'prompt' (a string) or 'messages' is required")
                .into_response();
        };
        let special = match body.get("add_special_tokens") {
            None | Some(Value::Null) => true,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return ApiError::bad_request(p, "'add_special_tokens' must be a boolean")
                    .into_response();
            }
        };
        let mut ids: Vec<u32> = if special {
            tok.special_id(SpecialToken::Bos.deepseek_spelling())
                .into_iter()
                .collect()
        } else {
            Vec::new()
        };
        if let Err(e) = tok.encode_plain_into(text, &mut ids) {
            return ApiError::bad_request(p, format!("cannot encode: {e}")).into_response();
        }
        ids
    };
    axum::Json(json!({
        "count": tokens.len(),
        "max_model_len": st.online.max_model_len(),
        "tokens": tokens,
    }))
    .into_response()
}

/// `POST /detokenize`: `{"tokens": [ids]}` → `{"prompt": text}`.
pub(crate) async fn detokenize(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let p = Protocol::ChatCompletions;
    let body = match read_json(&headers, body, st.cfg.max_body_bytes, p).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let tok = st.front.tokenizer();
    let ids: Option<Vec<u32>> = body.get("tokens").and_then(Value::as_array).and_then(|a| {
        a.iter()
            .map(|v| v.as_u64().and_then(|t| u32::try_from(t).ok()))
            .collect()
    });
    let Some(ids) = ids else {
        return ApiError::bad_request(p, "'tokens' must be a list of token ids").into_response();
    };
    let v = tok.vocab_size();
    if let Some(t) = ids.iter().find(|&&t| t as usize >= v) {
        return ApiError::bad_request(p, format!("token {t} is outside the vocabulary ({v})"))
            .into_response();
    }
    match tok.decode(&ids) {
        Ok(text) => axum::Json(json!({"prompt": text})).into_response(),
        Err(e) => ApiError::bad_request(p, format!("cannot decode: {e}")).into_response(),
    }
}

/// Unknown routes: 404 in the OpenAI shape.
pub(crate) async fn not_found() -> Response {
    ApiError::new(
        StatusCode::NOT_FOUND,
        Protocol::ChatCompletions,
        "no such route",
    )
    .into_response()
}

/// A known route with the wrong method: 405 in the OpenAI shape.
pub(crate) async fn method_not_allowed() -> Response {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        Protocol::ChatCompletions,
        "method not allowed on this route",
    )
    .into_response()
}
