//! OpenAI Chat Completions bodies ↔ engine requests and outputs, through `deepinfer-recipe`
//! (request conversion, rendering by provenance, encoding, output parsing options).

use super::request::{GenParams, Output, Request, RequestId};
use crate::config::ModelKind;
use deepinfer_recipe::protocol::chat::ChatRequest;
use deepinfer_recipe::protocol::{ConversionOptions, ModelSpec, Protocol, RequestError};
use deepinfer_recipe::{PromptFormat, PromptTokenizer, Renderer};
use deepinfer_sample::SamplingParams;
use serde_json::{Value, json};
use std::sync::Arc;

/// The id the vendored V4 vocabulary lacks for V4.1's `<｜System｜>`: mapped to a reserved
/// placeholder id (configuration, not a claim about the real V4.1 vocabulary).
pub const V41_SYSTEM_FALLBACK_ID: u32 = 128_001;

/// A chat body that cannot run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ChatError {
    /// Rejected by the protocol layer.
    #[error("{0}")]
    Request(#[from] RequestError),
    /// The prompt could not be encoded.
    #[error("cannot encode the prompt: {0}")]
    Encode(String),
}

impl ChatError {
    /// The error body in the OpenAI shape.
    pub fn to_json(&self) -> Value {
        match self {
            ChatError::Request(e) => e.to_json(Protocol::ChatCompletions),
            ChatError::Encode(m) => {
                json!({"error": {"message": m, "type": "invalid_request_error", "param": null, "code": "invalid_request_error"}})
            }
        }
    }
}

/// A converted chat body: one engine request per choice (`n`).
#[derive(Debug, Clone)]
pub struct PreparedChat {
    /// The engine requests (ids `first_id ..`).
    pub requests: Vec<Request>,
    /// The model name as requested.
    pub model: String,
    /// Thinking mode (the response then carries `reasoning_content`).
    pub thinking: bool,
    /// Prompt tokens.
    pub prompt_tokens: usize,
}

/// Converts chat bodies for one model.
#[derive(Debug, Clone)]
pub struct ChatFrontend {
    tokenizer: Arc<PromptTokenizer>,
    format: PromptFormat,
    /// `max_tokens` when a body gives none.
    pub default_max_tokens: usize,
    /// Thinking mode when a body does not say.
    pub default_thinking: bool,
}

impl ChatFrontend {
    /// A frontend for a model of `kind` (V4.1 renders the V4.1 format, V4 the V4 format).
    pub fn new(tokenizer: PromptTokenizer, kind: ModelKind) -> Self {
        let format = match kind {
            ModelKind::V41 => PromptFormat::V41,
            ModelKind::V4 => PromptFormat::V4,
        };
        let tokenizer =
            if format == PromptFormat::V41 && tokenizer.special_id("<｜System｜>").is_none() {
                tokenizer.with_special_id("<｜System｜>", V41_SYSTEM_FALLBACK_ID)
            } else {
                tokenizer
            };
        Self {
            tokenizer: Arc::new(tokenizer),
            format,
            default_max_tokens: 64,
            default_thinking: false,
        }
    }

    /// The tokenizer (shared with the engine's stream parsers).
    pub fn tokenizer(&self) -> &Arc<PromptTokenizer> {
        &self.tokenizer
    }

    /// Convert a Chat Completions body. Requests get ids `first_id ..= first_id + n - 1`;
    /// choice `i` uses seed `seed + i` (`seed` from the body, else `default_seed`).
    pub fn prepare(
        &self,
        body: &Value,
        first_id: RequestId,
        default_seed: u64,
    ) -> Result<PreparedChat, ChatError> {
        let model = body
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let mut options = ConversionOptions {
            default_thinking: self.default_thinking,
            ..ConversionOptions::default()
        };
        // Any model name is accepted and served by the loaded model.
        options = options.with_model(
            model.clone(),
            ModelSpec {
                format: self.format,
                supports_images: false,
            },
        );
        let chat = ChatRequest::from_json(&body.to_string())?;
        let conv = chat.convert(&options)?;
        let rendered = Renderer::new(self.format).render(&conv.conversation);
        let prompt = self
            .tokenizer
            .encode(&rendered)
            .map_err(|e| ChatError::Encode(e.to_string()))?;
        let f = |k: &str| body.get(k).and_then(Value::as_f64).map(|v| v as f32);
        let s = &conv.sampling;
        let seed = s.seed.unwrap_or(default_seed);
        let sampling = SamplingParams {
            temperature: s.temperature,
            top_p: s.top_p,
            top_k: body.get("top_k").and_then(Value::as_u64).unwrap_or(0) as u32,
            min_p: f("min_p").unwrap_or(0.0),
            repetition_penalty: f("repetition_penalty").unwrap_or(1.0),
            presence_penalty: f("presence_penalty").unwrap_or(0.0),
            frequency_penalty: f("frequency_penalty").unwrap_or(0.0),
            top_logprobs: s.top_logprobs.unwrap_or(0) as usize,
            seed,
            ..SamplingParams::default()
        };
        sampling
            .validate()
            .map_err(|e| ChatError::Request(RequestError::Malformed(e.to_string())))?;
        let n = s.n.max(1) as u64;
        let requests = (0..n)
            .map(|i| Request {
                id: first_id + i,
                prompt: prompt.clone(),
                params: GenParams {
                    sampling: SamplingParams {
                        seed: seed.wrapping_add(i),
                        ..sampling.clone()
                    },
                    max_tokens: s
                        .max_tokens
                        .map(|m| m as usize)
                        .unwrap_or(self.default_max_tokens),
                    logprobs: s.logprobs,
                    ..GenParams::default()
                },
                parsing: Some(conv.parsing.clone()),
            })
            .collect();
        Ok(PreparedChat {
            requests,
            model,
            thinking: conv.parsing.thinking.is_some(),
            prompt_tokens: prompt.len(),
        })
    }

    /// The `chat.completion` body for the outputs of one prepared chat (one per choice).
    pub fn response_json(
        &self,
        prep: &PreparedChat,
        outputs: &[Output],
        id: &str,
        created: u64,
    ) -> Value {
        let tok = |t: u32| self.tokenizer.decode(&[t]).unwrap_or_default();
        let choices: Vec<Value> = outputs
            .iter()
            .enumerate()
            .map(|(i, o)| {
                let mut message = json!({"role": "assistant", "content": o.text});
                if prep.thinking {
                    message["reasoning_content"] = json!(o.reasoning);
                }
                if !o.tool_calls.is_empty() {
                    message["tool_calls"] = Value::Array(
                        o.tool_calls
                            .iter()
                            .enumerate()
                            .map(|(k, c)| {
                                json!({"index": k, "id": format!("call_{i:02}_{k:02}_{id}"), "type": "function",
                                       "function": {"name": c.name, "arguments": c.arguments}})
                            })
                            .collect(),
                    );
                }
                let logprobs = o.logprobs.as_ref().map(|lp| {
                    json!({"content": lp.iter().map(|t| json!({
                        "token": tok(t.token), "token_id": t.token, "logprob": t.logprob,
                        "top_logprobs": t.top.iter().map(|&(a, p)| json!({"token": tok(a), "token_id": a, "logprob": p})).collect::<Vec<_>>(),
                    })).collect::<Vec<_>>()})
                });
                json!({"index": i, "message": message, "logprobs": logprobs, "finish_reason": o.finish_reason.as_openai()})
            })
            .collect();
        let completion: usize = outputs.iter().map(|o| o.usage.completion_tokens).sum();
        let cached = outputs.first().map(|o| o.usage.cached_tokens).unwrap_or(0);
        json!({
            "id": id,
            "object": "chat.completion",
            "created": created,
            "model": prep.model,
            "choices": choices,
            "usage": {
                "prompt_tokens": prep.prompt_tokens,
                "completion_tokens": completion,
                "total_tokens": prep.prompt_tokens + completion,
                "prompt_tokens_details": {"cached_tokens": cached},
            },
            "system_fingerprint": null,
        })
    }
}
