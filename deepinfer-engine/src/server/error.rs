//! Error responses in the shape of the protocol the client speaks.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use deepinfer_recipe::protocol::Protocol;
use serde_json::{Value, json};

/// An error answer: a status and a body in the protocol's error shape.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// The body.
    pub body: Value,
}

impl ApiError {
    /// An error of `status` in the shape of `protocol`: OpenAI's
    /// `{"error": {"message", "type", "param", "code"}}` or Anthropic's
    /// `{"type": "error", "error": {"type", "message"}}`.
    pub fn new(status: StatusCode, protocol: Protocol, message: impl Into<String>) -> Self {
        let message = message.into();
        let body = match protocol {
            Protocol::AnthropicMessages => json!({
                "type": "error",
                "error": {"type": anthropic_type(status), "message": message},
            }),
            _ => json!({
                "error": {
                    "message": message,
                    "type": openai_type(status),
                    "param": null,
                    "code": status.as_u16(),
                },
            }),
        };
        Self { status, body }
    }

    /// A body already in the protocol's shape (from the recipe's converters).
    pub fn with_body(status: StatusCode, body: Value) -> Self {
        Self { status, body }
    }

    /// 400 in the shape of `protocol`.
    pub fn bad_request(protocol: Protocol, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, protocol, message)
    }
}

fn openai_type(status: StatusCode) -> &'static str {
    match status {
        StatusCode::NOT_FOUND => "not_found_error",
        StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
        StatusCode::PAYLOAD_TOO_LARGE => "invalid_request_error",
        StatusCode::SERVICE_UNAVAILABLE => "service_unavailable_error",
        s if s.is_server_error() => "internal_server_error",
        _ => "invalid_request_error",
    }
}

fn anthropic_type(status: StatusCode) -> &'static str {
    match status {
        StatusCode::NOT_FOUND => "not_found_error",
        StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
        StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
        StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
        s if s.is_server_error() => "api_error",
        _ => "invalid_request_error",
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body)).into_response()
    }
}
