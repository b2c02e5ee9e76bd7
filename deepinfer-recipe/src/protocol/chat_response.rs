//! OpenAI Chat Completions responses: streamed chunks and the complete
//! response, built from parser [`Event`]s. Supports `n > 1` (one builder per
//! choice index) and log probabilities supplied by the caller.

use serde_json::{Value, json};

use super::PromptUsage;
use crate::parser::{CompletionUsage, Event, FinishReason};

/// Log probability of one generated token, as the sampler reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The token's text.
    pub token: String,
    /// Its log probability.
    pub logprob: f32,
    /// The most likely alternatives (text, log probability).
    pub top: Vec<(String, f32)>,
}

impl TokenLogprob {
    fn to_json(&self) -> Value {
        json!({
            "token": self.token,
            "logprob": self.logprob,
            "bytes": self.token.as_bytes(),
            "top_logprobs": self.top.iter().map(|(token, logprob)| json!({
                "token": token,
                "logprob": logprob,
                "bytes": token.as_bytes(),
            })).collect::<Vec<_>>(),
        })
    }
}

/// The chat `finish_reason` word.
pub fn finish_reason_word(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop | FinishReason::StopSequence | FinishReason::EndOfStream => "stop",
        FinishReason::ToolCalls => "tool_calls",
        FinishReason::Length => "length",
        FinishReason::ContentFilter => "content_filter",
    }
}

/// Chat usage JSON.
pub fn usage_json(prompt: PromptUsage, completion: CompletionUsage) -> Value {
    let mut usage = json!({
        "prompt_tokens": prompt.prompt_tokens,
        "completion_tokens": completion.completion_tokens,
        "total_tokens": prompt.prompt_tokens + completion.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": prompt.cached_tokens},
    });
    if let Some(reasoning) = completion.reasoning_tokens {
        usage["completion_tokens_details"] = json!({"reasoning_tokens": reasoning});
    }
    usage["prompt_cache_hit_tokens"] = json!(prompt.cached_tokens);
    usage["prompt_cache_miss_tokens"] =
        json!(prompt.prompt_tokens.saturating_sub(prompt.cached_tokens));
    usage
}

/// A generated tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GeneratedCall {
    /// Call id.
    pub id: String,
    /// Function name.
    pub name: String,
    /// Arguments JSON text.
    pub arguments: String,
}

/// Turns one choice's events into chunks, and accumulates the complete message.
#[derive(Debug, Clone)]
pub struct ChatChoice {
    id: String,
    model: String,
    created: u64,
    index: u32,
    thinking: bool,
    starts_in_reasoning: bool,
    include_usage: bool,
    prompt: PromptUsage,
    ids: CallIds,
    /// Accumulated answer.
    pub content: String,
    /// Accumulated reasoning.
    pub reasoning: String,
    /// Accumulated calls.
    pub calls: Vec<GeneratedCall>,
    logprobs: Vec<Value>,
    finish: Option<(FinishReason, CompletionUsage)>,
}

/// Generates tool-call ids: `call_NN_` + (`ET_` when the turn had no
/// reasoning in thinking mode) + random alphanumerics.
#[derive(Debug, Clone)]
pub struct CallIds {
    state: u64,
}

impl CallIds {
    /// Seeded generator (seed from the request id, for reproducibility).
    pub fn new(seed: &str) -> Self {
        Self {
            state: xxhash_rust::xxh3::xxh3_64(seed.as_bytes()) | 1,
        }
    }

    /// The id of call `index`.
    pub fn next_id(&mut self, index: usize, empty_thinking: bool) -> String {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        let mut random = String::with_capacity(24);
        for _ in 0..24 {
            // xorshift64*
            self.state ^= self.state >> 12;
            self.state ^= self.state << 25;
            self.state ^= self.state >> 27;
            let value = self.state.wrapping_mul(0x2545_F491_4F6C_DD1D);
            random.push(ALPHABET[(value >> 58) as usize % ALPHABET.len()] as char);
        }
        let marker = if empty_thinking { "ET_" } else { "" };
        format!("call_{index:02}_{marker}{random}")
    }
}

impl ChatChoice {
    /// A choice of a response `id` for `model`.
    pub fn new(
        id: impl Into<String>,
        model: impl Into<String>,
        created: u64,
        index: u32,
        thinking: bool,
        starts_in_reasoning: bool,
        include_usage: bool,
    ) -> Self {
        let id = id.into();
        Self {
            ids: CallIds::new(&format!("{id}/{index}")),
            id,
            model: model.into(),
            created,
            index,
            thinking,
            starts_in_reasoning,
            include_usage,
            prompt: PromptUsage::default(),
            content: String::new(),
            reasoning: String::new(),
            calls: Vec::new(),
            logprobs: Vec::new(),
            finish: None,
        }
    }

    fn chunk(&self, delta: Value, finish: Option<&str>, usage: Option<Value>) -> Value {
        json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": null,
            "choices": [{
                "index": self.index,
                "delta": delta,
                "logprobs": null,
                "finish_reason": finish,
            }],
            "usage": usage,
        })
    }

    /// The first chunk (role), with the prompt usage to report at the end.
    pub fn start(&mut self, prompt: PromptUsage) -> Value {
        self.prompt = prompt;
        let delta = if !self.thinking {
            json!({"role": "assistant", "content": ""})
        } else if self.starts_in_reasoning {
            json!({"role": "assistant", "content": null, "reasoning_content": ""})
        } else {
            json!({"role": "assistant", "content": "", "reasoning_content": null})
        };
        self.chunk(delta, None, None)
    }

    fn text_delta(&self, content: Option<&str>, reasoning: Option<&str>) -> Value {
        if self.thinking {
            json!({"content": content, "reasoning_content": reasoning})
        } else {
            json!({"content": content})
        }
    }

    /// The chunks for one event (log probabilities of its tokens optional).
    pub fn on_event(&mut self, event: &Event, logprobs: Option<&[TokenLogprob]>) -> Vec<Value> {
        let mut chunk = match event {
            Event::Reasoning(text) => {
                self.reasoning.push_str(text);
                self.chunk(self.text_delta(None, Some(text)), None, None)
            }
            Event::Content(text) => {
                self.content.push_str(text);
                self.chunk(self.text_delta(Some(text), None), None, None)
            }
            Event::ToolCallStart { index, name } => {
                let id = self
                    .ids
                    .next_id(*index, self.thinking && self.reasoning.is_empty());
                self.calls.push(GeneratedCall {
                    id: id.clone(),
                    name: name.clone(),
                    arguments: String::new(),
                });
                self.chunk(
                    json!({"tool_calls": [{
                        "index": index, "id": id, "type": "function",
                        "function": {"name": name, "arguments": ""},
                    }]}),
                    None,
                    None,
                )
            }
            Event::ToolCallArgs { index, delta } => {
                if let Some(call) = self.calls.get_mut(*index) {
                    call.arguments.push_str(delta);
                }
                self.chunk(
                    json!({"tool_calls": [{"index": index, "function": {"arguments": delta}}]}),
                    None,
                    None,
                )
            }
            Event::ToolCallEnd { .. } => return Vec::new(),
            Event::Finish { reason, usage, .. } => {
                self.finish = Some((*reason, *usage));
                let usage_value = self.include_usage.then(|| usage_json(self.prompt, *usage));
                self.chunk(
                    self.text_delta(Some(""), None),
                    Some(finish_reason_word(*reason)),
                    usage_value,
                )
            }
        };
        if let Some(logprobs) = logprobs.filter(|l| !l.is_empty()) {
            let values: Vec<Value> = logprobs.iter().map(TokenLogprob::to_json).collect();
            self.logprobs.extend(values.iter().cloned());
            chunk["choices"][0]["logprobs"] = json!({"content": values});
        }
        vec![chunk]
    }

    /// This choice in a complete response.
    pub fn message_json(&self) -> Value {
        let mut message = json!({"role": "assistant", "content": self.content});
        // A prefix continuation of the answer never reasons: no field then.
        if self.thinking && (self.starts_in_reasoning || !self.reasoning.is_empty()) {
            message["reasoning_content"] = json!(self.reasoning);
        }
        if !self.calls.is_empty() {
            message["tool_calls"] = Value::Array(
                self.calls
                    .iter()
                    .enumerate()
                    .map(|(index, call)| {
                        json!({
                            "index": index, "id": call.id, "type": "function",
                            "function": {"name": call.name, "arguments": call.arguments},
                        })
                    })
                    .collect(),
            );
        }
        let logprobs = if self.logprobs.is_empty() {
            Value::Null
        } else {
            json!({"content": self.logprobs})
        };
        json!({
            "index": self.index,
            "message": message,
            "logprobs": logprobs,
            "finish_reason": self.finish.map(|(reason, _)| finish_reason_word(reason)),
        })
    }

    /// The completion usage reported at finish.
    pub fn completion_usage(&self) -> CompletionUsage {
        self.finish.map(|(_, usage)| usage).unwrap_or_default()
    }
}

/// The complete (non-streamed) response over all choices.
pub fn complete_response(choices: &[ChatChoice], prompt: PromptUsage) -> Value {
    let first = choices.first();
    let mut completion = CompletionUsage::default();
    for choice in choices {
        let usage = choice.completion_usage();
        completion.completion_tokens += usage.completion_tokens;
        if let Some(reasoning) = usage.reasoning_tokens {
            *completion.reasoning_tokens.get_or_insert(0) += reasoning;
        }
    }
    json!({
        "id": first.map(|c| c.id.as_str()).unwrap_or_default(),
        "object": "chat.completion",
        "created": first.map(|c| c.created).unwrap_or_default(),
        "model": first.map(|c| c.model.as_str()).unwrap_or_default(),
        "choices": choices.iter().map(ChatChoice::message_json).collect::<Vec<_>>(),
        "usage": usage_json(prompt, completion),
        "system_fingerprint": null,
    })
}

/// One server-sent-event frame.
pub fn sse_frame(event: Option<&str>, data: &Value) -> String {
    match event {
        Some(name) => format!("event: {name}\ndata: {data}\n\n"),
        None => format!("data: {data}\n\n"),
    }
}

/// The final frame of a Chat Completions stream.
pub const SSE_DONE: &str = "data: [DONE]\n\n";
