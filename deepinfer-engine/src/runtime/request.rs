//! What goes into the engine and what comes out: token-level requests with their sampling
//! parameters, and finished outputs with text, reasoning, tool calls, log-probabilities,
//! usage and timing.

use deepinfer_kv::TrafficClass;
use deepinfer_recipe::grammar::{CompiledGrammar, Matcher, Triggered};
use deepinfer_recipe::protocol::ParsingOptions;
use deepinfer_sample::SamplingParams;
use std::sync::Arc;

/// Caller-visible request id (unique among the requests of one `generate` call).
pub type RequestId = u64;

/// How one request is generated.
#[derive(Debug, Clone, PartialEq)]
pub struct GenParams {
    /// Sampler settings: temperature, top-k, top-p, min-p, penalties, logit bias, seed,
    /// `top_logprobs`. `temperature: 0.0` is greedy.
    pub sampling: SamplingParams,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Generation stops after any of these token ids (EOS is added by the engine).
    pub stop_token_ids: Vec<u32>,
    /// Also stop at the model's end-of-sequence token.
    pub stop_at_eos: bool,
    /// Report the log-probability of every generated token (and `sampling.top_logprobs`
    /// alternatives).
    pub logprobs: bool,
    /// Parallel samples of the prompt (`n`): sample `i` uses seed `sampling.seed + i`; they
    /// share the prompt's KV blocks through scheduler forks. Outputs come back one per sample
    /// (see [`Output::index`]).
    pub n: usize,
    /// Traffic class of the prefix states this request leaves in the persistent tier (their
    /// lifetime: chat 7 days, agent 3 days by default).
    pub cache_class: TrafficClass,
}

impl Default for GenParams {
    fn default() -> Self {
        Self {
            sampling: SamplingParams::default(),
            max_tokens: 64,
            stop_token_ids: Vec::new(),
            stop_at_eos: true,
            logprobs: false,
            n: 1,
            cache_class: TrafficClass::CHAT,
        }
    }
}

impl GenParams {
    /// Greedy decoding of at most `max_tokens` tokens.
    pub fn greedy(max_tokens: usize) -> Self {
        Self {
            sampling: SamplingParams::greedy(),
            max_tokens,
            ..Self::default()
        }
    }
}

/// A grammar constraint on a request's output (structured outputs): a compiled grammar from
/// the recipe crate, engaged after `arm_after` (e.g. `</think>`) and then `trigger` (e.g. the
/// DSML marker of a tool-call block), as token ids; with neither it constrains from the
/// first token. The sampler only sees tokens the grammar allows.
#[derive(Clone)]
pub struct GrammarConstraint {
    /// The compiled grammar (shared; each request gets its own matcher).
    pub grammar: Arc<dyn CompiledGrammar>,
    /// Free text until this token id.
    pub arm_after: Option<u32>,
    /// Then free text until this token id.
    pub trigger: Option<u32>,
    /// Vocabulary size of the grammar's token table (at most the model's).
    pub vocab_size: usize,
}

impl GrammarConstraint {
    /// A fresh matcher at the start of the output.
    pub fn matcher(&self) -> Box<dyn Matcher> {
        Box::new(Triggered::new(
            self.grammar.matcher(),
            self.arm_after,
            self.trigger,
            self.vocab_size,
        ))
    }
}

impl std::fmt::Debug for GrammarConstraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarConstraint")
            .field("arm_after", &self.arm_after)
            .field("trigger", &self.trigger)
            .field("vocab_size", &self.vocab_size)
            .finish_non_exhaustive()
    }
}

impl PartialEq for GrammarConstraint {
    fn eq(&self, o: &Self) -> bool {
        // The same compiled grammar object (compiled grammars have no value equality).
        Arc::ptr_eq(&self.grammar, &o.grammar)
            && self.arm_after == o.arm_after
            && self.trigger == o.trigger
            && self.vocab_size == o.vocab_size
    }
}

/// One request: prompt token ids (already rendered and encoded), generation parameters, and
/// optionally how to parse the output into reasoning / content / tool calls (needs a
/// tokenizer on the engine; without one only token ids come back).
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Caller-chosen id.
    pub id: RequestId,
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Generation parameters.
    pub params: GenParams,
    /// Output parsing (stop sequences, thinking, tool calls), when text is wanted.
    pub parsing: Option<ParsingOptions>,
    /// Grammar constraint (structured outputs: `response_format`, tool calls).
    pub grammar: Option<GrammarConstraint>,
}

impl Request {
    /// A request over token ids with plain (content-only) parsing.
    pub fn new(id: RequestId, prompt: Vec<u32>, params: GenParams) -> Self {
        Self {
            id,
            prompt,
            params,
            parsing: None,
            grammar: None,
        }
    }
}

/// Why a request finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// End-of-sequence or a stop token.
    Stop,
    /// A stop sequence matched in the text.
    StopSequence,
    /// The model ended its turn after tool calls.
    ToolCalls,
    /// `max_tokens` or the context limit.
    Length,
    /// Aborted by the caller.
    Aborted,
}

impl FinishReason {
    /// The OpenAI `finish_reason` word.
    pub fn as_openai(self) -> &'static str {
        match self {
            FinishReason::Stop | FinishReason::StopSequence | FinishReason::Aborted => "stop",
            FinishReason::ToolCalls => "tool_calls",
            FinishReason::Length => "length",
        }
    }
}

/// Log-probability of one generated token.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The token.
    pub token: u32,
    /// Its log-probability under the distribution it was drawn from.
    pub logprob: f32,
    /// The best alternatives, best first.
    pub top: Vec<(u32, f32)>,
}

/// A structured tool call parsed from the output: its function name and arguments JSON text
/// (assembled by `deepinfer-recipe`).
pub use deepinfer_recipe::parser::ToolCallText as ToolCallOut;

/// Token counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens whose model state came from the prefix cache at first admission.
    pub cached_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
}

/// Wall-clock timing of one request, from the start of `generate`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timing {
    /// Time to the first generated token, ms.
    pub ttft_ms: f64,
    /// Time to the last token, ms.
    pub total_ms: f64,
}

/// A finished request.
#[derive(Debug, Clone, PartialEq)]
pub struct Output {
    /// The request id.
    pub id: RequestId,
    /// Which of the request's `n` samples this is (0 for `n = 1`).
    pub index: usize,
    /// Generated token ids (a matched stop token included).
    pub token_ids: Vec<u32>,
    /// Per-token log-probabilities, when asked.
    pub logprobs: Option<Vec<TokenLogprob>>,
    /// Answer text (empty without a tokenizer).
    pub text: String,
    /// Reasoning text (thinking mode).
    pub reasoning: String,
    /// Tool calls.
    pub tool_calls: Vec<ToolCallOut>,
    /// Why it finished.
    pub finish_reason: FinishReason,
    /// Token counts.
    pub usage: Usage,
    /// Timing.
    pub timing: Timing,
}
