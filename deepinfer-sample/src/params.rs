//! Per-row sampling parameters.

use crate::error::SampleError;

/// Which distribution the reported log-probabilities come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum LogprobSource {
    /// The distribution the token was actually drawn from: after mask, bias,
    /// penalties, temperature and top-k/top-p/min-p, in fixed point
    /// (`ln(w / W)`). Cheap; tokens outside the filters have no entry.
    #[default]
    Sampled,
    /// Log-softmax of the processed logits (mask, bias, penalties and
    /// temperature applied) over every allowed token, before truncation.
    /// Costs one more pass over the row.
    Processed,
}

/// How one row is sampled. `Default` is plain sampling at temperature 1.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// Temperature; values below [`MIN_TEMPERATURE`] (including 0, "greedy")
    /// are clamped to it, so there is one code path.
    pub temperature: f32,
    /// Keep the `top_k` best tokens; 0 disables.
    pub top_k: u32,
    /// Keep the smallest best-first prefix whose probability reaches
    /// `top_p`; 1 disables. Must be in `(0, 1]`.
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p` times the top
    /// probability; 0 disables. Must be in `[0, 1]`.
    pub min_p: f32,
    /// Repetition penalty (CTRL style) on tokens in the history: positive
    /// logits are divided by it, others multiplied; 1 disables.
    pub repetition_penalty: f32,
    /// Subtracted once from the logit of every token in the history.
    pub presence_penalty: f32,
    /// Subtracted `count` times from the logit of a token seen `count` times.
    pub frequency_penalty: f32,
    /// Added to the logit of the token before penalties (duplicates add up).
    pub logit_bias: Vec<(u32, f32)>,
    /// Seed of the request's random stream.
    pub seed: u64,
    /// How many alternatives to report besides the chosen token.
    pub top_logprobs: usize,
    /// Which distribution the log-probabilities describe.
    pub logprob_source: LogprobSource,
}

/// The smallest temperature used; smaller ones (and 0) are clamped to it.
pub const MIN_TEMPERATURE: f32 = 1e-5;

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: 0,
            top_logprobs: 0,
            logprob_source: LogprobSource::Sampled,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding: temperature 0 (clamped to [`MIN_TEMPERATURE`]).
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// Check every field that does not depend on the vocabulary.
    pub fn validate(&self) -> Result<(), SampleError> {
        if self.temperature.is_nan() || self.temperature < 0.0 {
            return Err(SampleError::InvalidTemperature(self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(SampleError::TopPOutOfRange(self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(SampleError::MinPOutOfRange(self.min_p));
        }
        let rp = self.repetition_penalty;
        if !(rp.is_finite() && rp > 0.0) {
            return Err(SampleError::InvalidPenalty {
                name: "repetition",
                value: rp,
            });
        }
        for (name, value) in [
            ("presence", self.presence_penalty),
            ("frequency", self.frequency_penalty),
        ] {
            if !value.is_finite() {
                return Err(SampleError::InvalidPenalty { name, value });
            }
        }
        for &(token, value) in &self.logit_bias {
            if !value.is_finite() {
                return Err(SampleError::InvalidBias { token, value });
            }
        }
        Ok(())
    }

    /// The temperature actually used: `max(temperature, MIN_TEMPERATURE)`.
    pub fn effective_temperature(&self) -> f32 {
        self.temperature.max(MIN_TEMPERATURE)
    }

    /// Whether any history-dependent penalty is active.
    pub fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
    }

    /// `ceil(top_p * 2^32)`: top-p as an exact fixed-point fraction.
    pub fn top_p_fixed(&self) -> u64 {
        (f64::from(self.top_p) * crate::fixed_point::WEIGHT_ONE as f64).ceil() as u64
    }

    /// `ceil(min_p * 2^32)`: the smallest weight min-p keeps (the top token
    /// always has weight 2^32).
    pub fn min_p_weight(&self) -> u64 {
        (f64::from(self.min_p) * crate::fixed_point::WEIGHT_ONE as f64).ceil() as u64
    }
}
