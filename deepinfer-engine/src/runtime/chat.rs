//! OpenAI Chat Completions bodies ↔ engine requests and outputs, through `deepinfer-recipe`
//! (request conversion, rendering by provenance, encoding, output parsing options).

use super::request::{GenParams, GrammarConstraint, Output, Request, RequestId};
use crate::config::ModelKind;
use deepinfer_recipe::grammar::{
    GrammarCache, GrammarSpec, GrammarVocab, RegexBackend, dsml_tool_calls_regex,
};
use deepinfer_recipe::protocol::anthropic::MessagesRequest;
use deepinfer_recipe::protocol::chat::ChatRequest;
use deepinfer_recipe::protocol::responses;
use deepinfer_recipe::protocol::{
    ConversionOptions, ModelSpec, OutputConstraint, ParsingOptions, Protocol, RequestError,
    ThinkingStart,
};
use deepinfer_recipe::{PromptFormat, PromptTokenizer, Renderer, SpecialToken};
use deepinfer_sample::SamplingParams;
use serde_json::{Value, json};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// The id the vendored V4 vocabulary lacks for V4.1's `<｜System｜>`: mapped to a reserved,
/// otherwise unused id (configuration, not a claim about the real V4.1 vocabulary).
pub const V41_SYSTEM_FALLBACK_ID: u32 = 128_001;

/// A regex constraint on the whole output, anchored at its end.
fn regex_spec(pattern: &str) -> GrammarSpec {
    GrammarSpec::Regex(format!("(?:{pattern})$"))
}

/// A chat body that cannot run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ChatError {
    /// Rejected by the protocol layer.
    #[error("{0}")]
    Request(#[from] RequestError),
    /// The prompt could not be encoded.
    #[error("cannot encode the prompt: {0}")]
    Encode(String),
    /// The structured-output constraint (`response_format`, tools) cannot be compiled.
    #[error("cannot compile the output grammar: {0}")]
    Grammar(String),
}

impl ChatError {
    /// The error body in the OpenAI shape.
    pub fn to_json(&self) -> Value {
        self.to_json_for(Protocol::ChatCompletions)
    }

    /// The error body in the shape of `protocol` (OpenAI's, or Anthropic's for Messages).
    pub fn to_json_for(&self, protocol: Protocol) -> Value {
        match self {
            ChatError::Request(e) => e.to_json(protocol),
            ChatError::Encode(m) | ChatError::Grammar(m) => match protocol {
                Protocol::AnthropicMessages => {
                    json!({"type": "error", "error": {"type": "invalid_request_error", "message": m}})
                }
                _ => {
                    json!({"error": {"message": m, "type": "invalid_request_error", "param": null, "code": "invalid_request_error"}})
                }
            },
        }
    }
}

/// A converted chat body: one engine request (its `n` choices are parallel samples).
#[derive(Debug, Clone)]
pub struct PreparedChat {
    /// The engine requests (one, id `first_id`; kept a list for callers that split choices).
    pub requests: Vec<Request>,
    /// The model name as requested.
    pub model: String,
    /// Thinking mode (the response then carries `reasoning_content`).
    pub thinking: bool,
    /// The output starts inside the reasoning block (a streamed response opens with
    /// `reasoning_content`).
    pub starts_in_reasoning: bool,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// The body asked for a streamed response.
    pub stream: bool,
    /// A streamed response ends with a usage chunk (`stream_options.include_usage`).
    pub include_usage: bool,
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
    /// Structured JSON outputs without whitespace between tokens (`{"a":1}`), as grammar
    /// engines offer (`any_whitespace = false`): a model, above all one with random weights,
    /// can otherwise pad JSON with whitespace until its token limit. Read per request.
    pub compact_json: bool,
    /// Compiled grammars (built on first use: the grammar vocabulary indexes every token).
    grammars: Arc<OnceLock<Result<Grammars, String>>>,
}

/// The grammar caches of one frontend, over one vocabulary. A cache holds one backend, and
/// the backend decides whether JSON may hold whitespace, so compact JSON has its own cache.
#[derive(Debug)]
struct Grammars {
    /// Regexes, tool calls, and JSON with whitespace between tokens.
    spaced: GrammarCache,
    /// JSON without whitespace between tokens.
    compact: GrammarCache,
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
            compact_json: true,
            grammars: Arc::new(OnceLock::new()),
        }
    }

    fn special(&self, t: SpecialToken) -> Option<u32> {
        self.tokenizer.special_id(t.deepseek_spelling())
    }

    /// Compile the output constraint of a converted request into a grammar constraint:
    /// JSON / regex from the first answer token (after `</think>` in thinking mode), tool
    /// calls from the DSML marker token (or from the start when the prompt opened the block).
    pub fn grammar(
        &self,
        constraint: &OutputConstraint,
        parsing: &ParsingOptions,
    ) -> Result<GrammarConstraint, ChatError> {
        let eos = self.special(SpecialToken::Eos);
        let dsml = self.special(SpecialToken::Dsml);
        let caches = self
            .grammars
            .get_or_init(|| {
                let eos = eos.ok_or("the tokenizer has no end-of-sequence token")?;
                let symbols: Vec<(u32, u8)> = dsml.map(|d| (d, 0)).into_iter().collect();
                let vocab = Arc::new(GrammarVocab::from_tokenizer(
                    &self.tokenizer,
                    &[eos],
                    &symbols,
                ));
                let cache = |backend: RegexBackend| {
                    GrammarCache::new(
                        Arc::new(backend),
                        Arc::clone(&vocab),
                        Duration::from_secs(30),
                    )
                };
                Ok(Grammars {
                    spaced: cache(RegexBackend::default()),
                    compact: cache(RegexBackend::default().with_json_whitespace(false)),
                })
            })
            .as_ref()
            .map_err(|e| ChatError::Grammar(e.clone()))?;
        // JSON goes to the recipe's JSON specs: `json_object`, recursive `$ref`s and free-form
        // values compile to its pushdown matcher and nest without bound (up to its depth cap).
        // The matchers refuse a token running past a complete document by themselves.
        let (spec, trigger, cache) = match constraint {
            OutputConstraint::Json { schema } => {
                let spec = match schema {
                    Some(schema) => GrammarSpec::JsonSchema(schema.clone()),
                    None => GrammarSpec::JsonObject,
                };
                let cache = if self.compact_json {
                    &caches.compact
                } else {
                    &caches.spaced
                };
                (spec, None, cache)
            }
            // `$` (see `regex_spec`): redundant, since the recipe's matchers refuse a token
            // running past a complete output themselves (its DFA reports a match one byte late
            // and the matcher accounts for it), but kept so these specs stay as they were.
            OutputConstraint::Regex(r) => (regex_spec(r), None, &caches.spaced),
            OutputConstraint::ToolCalls { tools, .. } => {
                let inside = parsing.starts_in_tool_calls;
                let trigger = if inside {
                    None
                } else {
                    Some(dsml.ok_or_else(|| {
                        ChatError::Grammar("the tokenizer has no DSML token".into())
                    })?)
                };
                let p = dsml_tool_calls_regex(self.format, tools, inside)
                    .map_err(|e| ChatError::Grammar(e.to_string()))?;
                (regex_spec(&p), trigger, &caches.spaced)
            }
        };
        let arm_after = match parsing.thinking {
            Some(ThinkingStart::ReasoningStart | ThinkingStart::ReasoningContinuation) => {
                Some(self.special(SpecialToken::ThinkingEnd).ok_or_else(|| {
                    ChatError::Grammar("the tokenizer has no </think> token".into())
                })?)
            }
            _ => None,
        };
        let grammar = cache
            .get(&spec)
            .map_err(|e| ChatError::Grammar(e.to_string()))?;
        Ok(GrammarConstraint {
            grammar,
            arm_after,
            trigger,
            vocab_size: self.tokenizer.vocab_size(),
        })
    }

    /// The tokenizer (shared with the engine's stream parsers).
    pub fn tokenizer(&self) -> &Arc<PromptTokenizer> {
        &self.tokenizer
    }

    /// Convert a Chat Completions body into one request of id `first_id`; choice `i` of its
    /// `n` uses seed `seed + i` (`seed` from the body, else `default_seed`).
    pub fn prepare(
        &self,
        body: &Value,
        first_id: RequestId,
        default_seed: u64,
    ) -> Result<PreparedChat, ChatError> {
        self.prepare_as(Protocol::ChatCompletions, body, first_id, default_seed)
    }

    /// Convert a body of `protocol` (Chat Completions, Responses or Anthropic Messages) as
    /// [`ChatFrontend::prepare`] does.
    pub fn prepare_as(
        &self,
        protocol: Protocol,
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
        let text = body.to_string();
        let conv = match protocol {
            Protocol::ChatCompletions => ChatRequest::from_json(&text)?.convert(&options)?,
            Protocol::Responses => responses::convert_request(&text, &options)?,
            Protocol::AnthropicMessages => MessagesRequest::from_json(&text)?.convert(&options)?,
        };
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
        let grammar = conv
            .constraint
            .as_ref()
            .map(|c| self.grammar(c, &conv.parsing))
            .transpose()?;
        let requests = vec![Request {
            id: first_id,
            prompt: prompt.clone(),
            params: GenParams {
                sampling,
                max_tokens: s
                    .max_tokens
                    .map(|m| m as usize)
                    .unwrap_or(self.default_max_tokens),
                logprobs: s.logprobs,
                n: s.n.max(1) as usize,
                cache_class: traffic_class(body)?,
                stop_at_eos: !ignore_eos(body)?,
                ..GenParams::default()
            },
            parsing: Some(conv.parsing.clone()),
            grammar,
        }];
        Ok(PreparedChat {
            requests,
            model,
            thinking: conv.parsing.thinking.is_some(),
            starts_in_reasoning: matches!(
                conv.parsing.thinking,
                Some(ThinkingStart::ReasoningStart | ThinkingStart::ReasoningContinuation)
            ),
            prompt_tokens: prompt.len(),
            stream: conv.stream,
            include_usage: conv.include_usage,
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

/// The traffic class a request's prefix states are kept under in the persistent cache:
/// `metadata.traffic_class` (`"chat"` or `"agent"`) when given, else agent for a request that
/// declares tools and chat otherwise.
/// `ignore_eos` (vLLM's extension): generate `max_tokens` even past an end of sentence.
fn ignore_eos(body: &Value) -> Result<bool, ChatError> {
    match body.get("ignore_eos") {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(ChatError::Request(RequestError::Malformed(format!(
            "ignore_eos must be a boolean, not {v}"
        )))),
    }
}

fn traffic_class(body: &Value) -> Result<deepinfer_kv::TrafficClass, ChatError> {
    use deepinfer_kv::TrafficClass;
    match body.pointer("/metadata/traffic_class") {
        Some(Value::String(c)) if c == "chat" => Ok(TrafficClass::CHAT),
        Some(Value::String(c)) if c == "agent" => Ok(TrafficClass::AGENT),
        Some(v) => Err(ChatError::Request(RequestError::Malformed(format!(
            "metadata.traffic_class must be \"chat\" or \"agent\", not {v}"
        )))),
        None => Ok(
            if body
                .get("tools")
                .and_then(Value::as_array)
                .is_some_and(|t| !t.is_empty())
            {
                TrafficClass::AGENT
            } else {
                TrafficClass::CHAT
            },
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deepinfer_kv::TrafficClass;
    use serde_json::json;

    #[test]
    fn the_traffic_class_comes_from_metadata_or_the_tools() {
        let front = ChatFrontend::new(
            PromptTokenizer::deepseek_v4().unwrap(),
            crate::ModelKind::V41,
        );
        let class = |body: Value| {
            let mut body = body;
            body["model"] = json!("deepinfer");
            front
                .prepare(&body, 0, 0)
                .map(|p| p.requests[0].params.cache_class)
        };
        let msgs = json!([{"role": "user", "content": "hi"}]);
        assert_eq!(
            class(json!({"messages": msgs})).unwrap(),
            TrafficClass::CHAT
        );
        let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);
        assert_eq!(
            class(json!({"messages": msgs, "tools": tools})).unwrap(),
            TrafficClass::AGENT
        );
        assert_eq!(
            class(json!({"messages": msgs, "tools": tools, "metadata": {"traffic_class": "chat"}}))
                .unwrap(),
            TrafficClass::CHAT
        );
        assert_eq!(
            class(json!({"messages": msgs, "metadata": {"traffic_class": "agent"}})).unwrap(),
            TrafficClass::AGENT
        );
        let e =
            class(json!({"messages": msgs, "metadata": {"traffic_class": "bulk"}})).unwrap_err();
        assert!(e.to_string().contains("traffic_class"), "{e}");
    }
}
