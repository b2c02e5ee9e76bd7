//! One request's response in the protocol it came in: streamed frames from parser events,
//! or the complete body at the end. The event mappings are the recipe crate's; this file
//! only picks the one for the protocol and frames it.

use super::sink::TokLogprob;
use crate::runtime::{ChatFrontend, Output, PreparedChat};
use deepinfer_recipe::Event;
use deepinfer_recipe::PromptTokenizer;
use deepinfer_recipe::parser::CompletionUsage;
use deepinfer_recipe::protocol::PromptUsage;
use deepinfer_recipe::protocol::anthropic::MessagesStream;
use deepinfer_recipe::protocol::chat_response::{
    ChatChoice, SSE_DONE, TokenLogprob, finish_reason_word, sse_frame, usage_json,
};
use deepinfer_recipe::protocol::responses::ResponsesStream;
use serde_json::{Value, json};
use std::sync::Arc;

/// Which response a request gets.
pub(crate) enum Render {
    /// Chat Completions: a choice builder per sample.
    Chat {
        choices: Vec<ChatChoice>,
        prep: PreparedChat,
        id: String,
        created: u64,
    },
    /// OpenAI Responses (one sample), with the prompt's length.
    Responses(Box<ResponsesStream>, usize),
    /// Anthropic Messages (one sample), with the prompt's length.
    Messages(Box<MessagesStream>, usize),
    /// Legacy completions: text deltas.
    Completion {
        id: String,
        model: String,
        created: u64,
        prompt_tokens: usize,
        include_usage: bool,
    },
}

fn prompt_usage(prompt_tokens: usize, cached: usize) -> PromptUsage {
    PromptUsage {
        prompt_tokens: prompt_tokens as u32,
        cached_tokens: cached as u32,
    }
}

impl Render {
    /// A chat response for a prepared body.
    pub fn chat(prep: PreparedChat, id: String, created: u64) -> Self {
        let n = prep.requests.first().map_or(1, |r| r.params.n.max(1));
        let choices = (0..n)
            .map(|i| {
                ChatChoice::new(
                    id.clone(),
                    prep.model.clone(),
                    created,
                    i as u32,
                    prep.thinking,
                    prep.starts_in_reasoning,
                    false,
                )
            })
            .collect();
        Render::Chat {
            choices,
            prep,
            id,
            created,
        }
    }

    /// Whether the complete body is built from the parser events (Responses, Messages) rather
    /// than from the finished outputs (chat, completions): a non-streamed request skips the
    /// events otherwise.
    pub fn completes_from_events(&self) -> bool {
        matches!(self, Render::Responses(..) | Render::Messages(..))
    }

    /// Frames that open the stream.
    pub fn start(&mut self) -> Vec<String> {
        match self {
            Render::Chat { choices, prep, .. } => choices
                .iter_mut()
                .map(|c| sse_frame(None, &c.start(prompt_usage(prep.prompt_tokens, 0))))
                .collect(),
            // The cached part is known only at the end (the non-streamed body reports it).
            Render::Responses(s, p) => named(s.start(prompt_usage(*p, 0))),
            Render::Messages(s, p) => named(s.start(prompt_usage(*p, 0))),
            Render::Completion { .. } => Vec::new(),
        }
    }

    /// Frames for one parser event of sample `index`.
    pub fn event(
        &mut self,
        tok: &PromptTokenizer,
        index: usize,
        event: &Event,
        logprobs: &[TokLogprob],
    ) -> Vec<String> {
        match self {
            Render::Chat { choices, .. } => {
                let Some(c) = choices.get_mut(index) else {
                    return Vec::new();
                };
                let lp: Vec<TokenLogprob> = logprobs
                    .iter()
                    .map(|(t, l, top)| TokenLogprob {
                        token: tok.decode(&[*t]).unwrap_or_default(),
                        logprob: *l,
                        top: top
                            .iter()
                            .map(|&(a, p)| (tok.decode(&[a]).unwrap_or_default(), p))
                            .collect(),
                    })
                    .collect();
                c.on_event(event, Some(&lp))
                    .iter()
                    .map(|v| sse_frame(None, v))
                    .collect()
            }
            Render::Responses(s, _) => named(s.on_event(event)),
            Render::Messages(s, _) => named(s.on_event(event)),
            Render::Completion {
                id, model, created, ..
            } => {
                let (text, finish) = match event {
                    Event::Content(t) => (t.as_str(), None),
                    Event::Finish { reason, .. } => ("", Some(finish_reason_word(*reason))),
                    _ => return Vec::new(),
                };
                let chunk = json!({
                    "id": id, "object": "text_completion", "created": created, "model": model,
                    "choices": [{"index": index, "text": text, "logprobs": null, "finish_reason": finish}],
                });
                vec![sse_frame(None, &chunk)]
            }
        }
    }

    /// Frames that close the stream once every sample finished.
    pub fn finish(&mut self, outs: &[Output]) -> Vec<String> {
        let completion: usize = outs.iter().map(|o| o.usage.completion_tokens).sum();
        let cached = outs.first().map_or(0, |o| o.usage.cached_tokens);
        let usage = |prompt: usize| {
            usage_json(
                prompt_usage(prompt, cached),
                CompletionUsage {
                    completion_tokens: completion as u32,
                    reasoning_tokens: None,
                },
            )
        };
        match self {
            Render::Chat {
                prep, id, created, ..
            } => {
                let mut out = Vec::new();
                if prep.include_usage {
                    let chunk = json!({
                        "id": id, "object": "chat.completion.chunk", "created": created,
                        "model": prep.model, "system_fingerprint": null,
                        "choices": [], "usage": usage(prep.prompt_tokens),
                    });
                    out.push(sse_frame(None, &chunk));
                }
                out.push(SSE_DONE.to_string());
                out
            }
            Render::Completion {
                id,
                model,
                created,
                prompt_tokens,
                include_usage,
            } => {
                let mut out = Vec::new();
                if *include_usage {
                    let chunk = json!({
                        "id": id, "object": "text_completion", "created": created, "model": model,
                        "choices": [], "usage": usage(*prompt_tokens),
                    });
                    out.push(sse_frame(None, &chunk));
                }
                out.push(SSE_DONE.to_string());
                out
            }
            Render::Responses(..) | Render::Messages(..) => Vec::new(),
        }
    }

    /// The complete (non-streamed) body.
    pub fn complete(&mut self, front: &ChatFrontend, outs: &[Output]) -> Value {
        let cached = outs.first().map_or(0, |o| o.usage.cached_tokens);
        match self {
            Render::Chat {
                prep, id, created, ..
            } => front.response_json(prep, outs, id, *created),
            Render::Responses(s, p) => {
                // Sets the prompt usage (the start events are not sent).
                s.start(prompt_usage(*p, cached));
                let cut = outs
                    .first()
                    .is_some_and(|o| o.finish_reason == crate::runtime::FinishReason::Length);
                s.response_json(if cut { "incomplete" } else { "completed" })
            }
            Render::Messages(s, p) => {
                s.start(prompt_usage(*p, cached));
                s.message()
            }
            Render::Completion {
                id,
                model,
                created,
                prompt_tokens,
                ..
            } => {
                let completion: usize = outs.iter().map(|o| o.usage.completion_tokens).sum();
                json!({
                    "id": id, "object": "text_completion", "created": created, "model": model,
                    "choices": outs.iter().map(|o| json!({
                        "index": o.index, "text": o.text, "logprobs": completion_logprobs(front.tokenizer(), o),
                        "finish_reason": o.finish_reason.as_openai(),
                    })).collect::<Vec<_>>(),
                    "usage": {
                        "prompt_tokens": prompt_tokens, "completion_tokens": completion,
                        "total_tokens": *prompt_tokens + completion,
                        "prompt_tokens_details": {"cached_tokens": outs.first().map_or(0, |o| o.usage.cached_tokens)},
                    },
                })
            }
        }
    }
}

/// The legacy completions `logprobs` object, or null.
fn completion_logprobs(tok: &Arc<PromptTokenizer>, o: &Output) -> Value {
    let Some(lp) = o.logprobs.as_ref() else {
        return Value::Null;
    };
    let text = |t: u32| tok.decode(&[t]).unwrap_or_default();
    json!({
        "tokens": lp.iter().map(|t| text(t.token)).collect::<Vec<_>>(),
        "token_logprobs": lp.iter().map(|t| t.logprob).collect::<Vec<_>>(),
        "top_logprobs": lp.iter().map(|t| {
            t.top.iter().map(|&(a, p)| (text(a), json!(p))).collect::<serde_json::Map<_, _>>()
        }).collect::<Vec<_>>(),
    })
}

fn named(events: Vec<(&'static str, Value)>) -> Vec<String> {
    events
        .iter()
        .map(|(name, v)| sse_frame(Some(name), v))
        .collect()
}
