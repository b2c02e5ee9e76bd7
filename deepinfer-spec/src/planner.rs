//! The verification budget planner: pools every draft of the batch, ranks them by running
//! product and keeps the total that maximises expected tokens per millisecond.

use crate::candidates::Candidates;
use crate::error::SpecError;
use crate::plan::{CurvePoint, Plan};
use crate::step_time::StepTimeModel;

/// How the planner walks the tokens-per-ms curve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Search {
    /// Evaluate every total from "no drafts" to "all drafts" and keep the best. Needed when the
    /// step-time curve is jagged (staircases, tile effects): the curve can dip and rise again.
    /// Its cost over [`Search::EarlyStop`] is a linear scan after the sort, so it is the default.
    #[default]
    Full,
    /// Stop at the first total whose tokens per ms drops below the previous one. Drafts are
    /// admitted in falling value, so expected tokens grow concavely; when step time is convex
    /// and non-decreasing in rows the ratio is unimodal and this loses nothing. On a jagged
    /// curve it can stop early (the worked example: 4 rows instead of 6).
    EarlyStop,
}

/// Planner settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PlannerConfig {
    /// Curve search strategy.
    pub search: Search,
    /// Upper bound on total rows per step (ordinary + draft), on top of the step-time table's
    /// own end. `None`: the table's end only.
    pub max_total_rows: Option<usize>,
    /// Upper bound on drafts verified per request. `None`: every draft given.
    pub max_drafts_per_request: Option<usize>,
}

/// Plans draft rows for each step.
///
/// Owns the [`StepTimeModel`] (feed it measured steps with [`Planner::observe`]) and scratch
/// buffers, so planning a step does not allocate once the buffers have grown to the batch size
/// (use [`Planner::plan_into`] to reuse the output too).
///
/// ```
/// use deepinfer_spec::{Planner, PlannerConfig, StepTimeModel};
///
/// let model = StepTimeModel::staircase(&[(4, 10.0), (6, 13.0), (8, 16.0)])?;
/// let mut planner = Planner::new(model, PlannerConfig::default())?;
/// let plan = planner.plan(&[[0.9, 0.9, 0.9], [0.5, 0.5, 0.5]])?;
/// assert_eq!(plan.draft_rows, [3, 1]);
/// assert_eq!(plan.total_rows, 6);
/// # Ok::<(), deepinfer_spec::SpecError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Planner {
    model: StepTimeModel,
    config: PlannerConfig,
    candidates: Candidates,
    /// `(requests, drafts scanned)` of the last successful plan.
    scanned: Option<(usize, usize)>,
}

impl Planner {
    /// A planner over `model`. Fails if a configured limit is zero.
    pub fn new(model: StepTimeModel, config: PlannerConfig) -> Result<Self, SpecError> {
        if config.max_total_rows == Some(0) {
            return Err(SpecError::InvalidConfig(
                "max_total_rows must be at least 1",
            ));
        }
        Ok(Self {
            model,
            config,
            candidates: Candidates::default(),
            scanned: None,
        })
    }

    /// The step-time model in use.
    pub fn model(&self) -> &StepTimeModel {
        &self.model
    }

    /// Mutable access to the step-time model (for example to reset its corrections).
    pub fn model_mut(&mut self) -> &mut StepTimeModel {
        &mut self.model
    }

    /// The configuration.
    pub fn config(&self) -> &PlannerConfig {
        &self.config
    }

    /// Records a measured step (`rows` rows took `ms`), correcting the model online.
    pub fn observe(&mut self, rows: usize, ms: f64) -> Result<(), SpecError> {
        self.model.observe(rows, ms)
    }

    /// The row limit in force: the table's end, lowered by `max_total_rows`.
    pub fn row_limit(&self) -> usize {
        let table = self.model.max_rows();
        self.config.max_total_rows.map_or(table, |m| m.min(table))
    }

    /// Plans one step. `requests[i]` holds request `i`'s draft confidences `c1..cn`, each the
    /// probability that the draft is accepted given that the earlier ones were.
    ///
    /// Errors: [`SpecError::EmptyBatch`], [`SpecError::InvalidConfidence`] (NaN or outside
    /// `[0, 1]`), [`SpecError::BatchTooLarge`] (more requests than the row limit).
    pub fn plan<C: AsRef<[f64]>>(&mut self, requests: &[C]) -> Result<Plan, SpecError> {
        let mut out = Plan::default();
        self.plan_into(requests, &mut out)?;
        Ok(out)
    }

    /// [`Planner::plan`] writing into `out`, reusing its allocation.
    pub fn plan_into<C: AsRef<[f64]>>(
        &mut self,
        requests: &[C],
        out: &mut Plan,
    ) -> Result<(), SpecError> {
        let max_drafts = self.config.max_drafts_per_request.unwrap_or(usize::MAX);
        self.scanned = None;
        self.candidates.build(requests, max_drafts)?;
        let n_req = requests.len();
        let limit = self.row_limit();
        if n_req > limit {
            return Err(SpecError::BatchTooLarge {
                requests: n_req,
                max: limit,
            });
        }
        let usable = self.candidates.len().min(limit - n_req);
        self.candidates.sort();

        // Ratios are compared by cross-multiplication (times are positive), which keeps
        // divisions out of the loop.
        let mut cursor = self.model.cursor();
        let mut tokens = n_req as f64;
        let ms = cursor.at(n_req);
        let (mut best_drafts, mut best_tokens, mut best_ms) = (0usize, tokens, ms);
        let mut scanned = usable;
        match self.config.search {
            Search::Full => {
                for (j, a) in self.candidates.products(usable).enumerate() {
                    tokens += a;
                    let ms = cursor.at(n_req + j + 1);
                    if tokens * best_ms > best_tokens * ms {
                        (best_drafts, best_tokens, best_ms) = (j + 1, tokens, ms);
                    }
                }
            }
            Search::EarlyStop => {
                let (mut prev_tokens, mut prev_ms) = (tokens, ms);
                for (j, a) in self.candidates.products(usable).enumerate() {
                    tokens += a;
                    let ms = cursor.at(n_req + j + 1);
                    if tokens * prev_ms < prev_tokens * ms {
                        scanned = j + 1;
                        break;
                    }
                    if tokens * best_ms > best_tokens * ms {
                        (best_drafts, best_tokens, best_ms) = (j + 1, tokens, ms);
                    }
                    (prev_tokens, prev_ms) = (tokens, ms);
                }
            }
        }
        self.scanned = Some((n_req, scanned));

        out.draft_rows.clear();
        out.draft_rows.resize(n_req, 0);
        self.candidates.count_into(best_drafts, &mut out.draft_rows);
        out.total_rows = n_req + best_drafts;
        out.expected_tokens = best_tokens;
        out.predicted_ms = best_ms;
        Ok(())
    }

    /// The curve scanned by the last successful plan: one point per total row count, from no
    /// drafts up to where the scan stopped (for [`Search::EarlyStop`], the first drop
    /// included). Rebuilt on demand from the last plan's ranked drafts, with the step-time model
    /// as it is now (so call it before [`Planner::observe`] to see what the plan saw). Empty
    /// before the first plan. For diagnostics and tests; planning does not pay for it.
    pub fn last_curve(&self) -> Vec<CurvePoint> {
        let Some((n_req, scanned)) = self.scanned else {
            return Vec::new();
        };
        let mut cursor = self.model.cursor();
        let mut tokens = n_req as f64;
        let mut curve = Vec::with_capacity(scanned + 1);
        curve.push(CurvePoint {
            rows: n_req,
            expected_tokens: tokens,
            ms: cursor.at(n_req),
        });
        for (j, a) in self.candidates.products(scanned).enumerate() {
            tokens += a;
            let rows = n_req + j + 1;
            curve.push(CurvePoint {
                rows,
                expected_tokens: tokens,
                ms: cursor.at(rows),
            });
        }
        curve
    }

    /// The fixed-length plan (see [`crate::fixed_length`]) under this planner's model and
    /// `max_drafts_per_request`.
    pub fn fixed_length<C: AsRef<[f64]>>(
        &self,
        drafts: usize,
        requests: &[C],
    ) -> Result<Plan, SpecError> {
        let n = drafts.min(self.config.max_drafts_per_request.unwrap_or(usize::MAX));
        crate::fixed::fixed_length(&self.model, n, requests)
    }
}
