//! What goes into the engine and what comes out: token-level requests with their sampling
//! parameters, and finished outputs with text, reasoning, tool calls, log-probabilities,
//! usage and timing.

use deepinfer_recipe::protocol::ParsingOptions;
use deepinfer_sample::SamplingParams;

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
}

impl Default for GenParams {
    fn default() -> Self {
        Self {
            sampling: SamplingParams::default(),
            max_tokens: 64,
            stop_token_ids: Vec::new(),
            stop_at_eos: true,
            logprobs: false,
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
}

impl Request {
    /// A request over token ids with plain (content-only) parsing.
    pub fn new(id: RequestId, prompt: Vec<u32>, params: GenParams) -> Self {
        Self {
            id,
            prompt,
            params,
            parsing: None,
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

/// A structured tool call parsed from the output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCallOut {
    /// Function name.
    pub name: String,
    /// Arguments JSON text.
    pub arguments: String,
}

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
