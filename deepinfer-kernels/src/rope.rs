//! RoPE inverse frequencies, plain and YaRN (host-side helper; the kernels take the result).

/// Parameters of one rotary embedding (`rope_parameters.main` / `.compress` in the configs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeParams {
    /// Base `theta`.
    pub theta: f64,
    /// Rotary dimensions (even); the kernels rotate the trailing `dims` channels.
    pub dims: usize,
    /// YaRN scaling, if any.
    pub yarn: Option<YarnParams>,
}

/// YaRN frequency interpolation (no magnitude scaling: DeepSeek V4 uses attention factor 1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct YarnParams {
    /// Context extension factor.
    pub factor: f64,
    /// Training context length.
    pub original_max_position_embeddings: f64,
    /// High-frequency boundary in rotations (default 32).
    pub beta_fast: f64,
    /// Low-frequency boundary in rotations (default 1).
    pub beta_slow: f64,
}

impl RopeParams {
    /// `dims / 2` inverse frequencies, exactly as `inv_freq_for` in the NumPy reference.
    pub fn inv_freq(&self) -> Vec<f64> {
        let r = self.dims as f64;
        let theta = self.theta;
        let mut f: Vec<f64> = (0..self.dims / 2)
            .map(|i| 1.0 / theta.powf((2 * i) as f64 / r))
            .collect();
        if let Some(y) = self.yarn {
            let corr = |n_rot: f64| {
                r * (y.original_max_position_embeddings / (n_rot * 2.0 * std::f64::consts::PI)).ln()
                    / (2.0 * theta.ln())
            };
            let lo = corr(y.beta_fast).floor().max(0.0);
            let mut hi = corr(y.beta_slow).ceil().min(r - 1.0);
            if lo == hi {
                hi += 0.001;
            }
            for (i, fi) in f.iter_mut().enumerate() {
                let ramp = ((i as f64 - lo) / (hi - lo)).clamp(0.0, 1.0);
                *fi = *fi / y.factor * ramp + *fi * (1.0 - ramp);
            }
        }
        f
    }
}
