//! Offline throughput at several concurrencies: per-user and total tokens/s, time to first
//! token, step time and tokens per decode row, as a table, JSON and an SVG chart of total
//! throughput against per-user speed.

use super::engine::{DRAFT_POSITIONS, Engine, EngineError};
use super::request::{GenParams, Request};
use deepinfer_kernels::Backend;
use serde_json::{Value, json};

/// One concurrency level's figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BenchPoint {
    /// Requests run together.
    pub concurrency: usize,
    /// Generated tokens over wall time, all requests.
    pub total_tok_s: f64,
    /// Mean over requests of decode tokens/s after the first token.
    pub per_user_tok_s: f64,
    /// Mean time to first token, ms.
    pub ttft_ms: f64,
    /// Mean wall time per engine step, ms.
    pub step_ms: f64,
    /// Generated tokens per decode row (1 without speculation; measured acceptance with it).
    pub tokens_per_row: f64,
    /// CPU time outside the model's forward (schedule, update, building the step, sampling,
    /// grammar, parsing, bookkeeping; not the drafter) over the wall time, whether or not
    /// it overlapped the forward.
    pub host_frac: f64,
    /// Share of the host thread's work (schedule, update, building the step, parsing,
    /// bookkeeping) done while a step computed (overlapped scheduling). Sampling and grammar
    /// masks run in the device step, so they are not counted here.
    pub hidden_frac: f64,
    /// Share of the wall time when no forward or drafter ran: the host work that was not
    /// hidden, plus hand-over gaps. The host overhead a user sees.
    pub exposed_frac: f64,
    /// Share of the wall time spent in the sampler (and draft verification).
    pub sample_frac: f64,
    /// Accepted over proposed draft tokens (0 without speculation).
    pub acceptance: f64,
    /// Drafts per row that verified drafts (0 without speculation).
    pub drafts_per_row: f64,
    /// For each draft position `i`: of the rows that verified a draft there, the share that
    /// kept drafts `0..=i` (0 where no row verified one).
    pub accepted_at: [f64; DRAFT_POSITIONS],
    /// Accepted drafts per row that verified drafts (0 without speculation).
    pub accepted_per_row: f64,
    /// Draft positions at least one row verified (the meaningful prefix of `accepted_at`).
    pub verified_positions: usize,
}

/// Where the benchmark's prompts come from.
#[derive(Debug, Clone, PartialEq)]
pub enum BenchPrompts {
    /// Pseudo-random token ids (no language: a trained drafter cannot guess them).
    Random,
    /// Windows of this token stream (a tokenised text), a different offset per request.
    Text(Vec<u32>),
}

impl BenchPrompts {
    /// The prompt of request `i` at level `level`.
    fn prompt(&self, level: usize, i: u64, len: usize, vocab: u64) -> Vec<u32> {
        let mut x = (level as u64 * 1_000_003 + i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        match self {
            Self::Random => (0..len)
                .map(|_| (next() % (vocab.min(100_000) - 10)) as u32 + 10)
                .collect(),
            Self::Text(ids) => {
                let room = ids.len().saturating_sub(len).max(1) as u64;
                let at = (next() % room) as usize;
                ids[at..(at + len).min(ids.len())].to_vec()
            }
        }
    }
}

impl BenchPoint {
    /// What the measured acceptance `a` over `n` drafts would claim per decode row if each
    /// draft were accepted independently (`1 + n·a`) and under prefix acceptance, where a
    /// draft counts only after all before it (`1 + a + … + aⁿ`); beside the measured
    /// [`BenchPoint::tokens_per_row`] they show how far a headline "acceptance" can mislead.
    pub fn claimed_tokens_per_row(&self) -> (f64, f64) {
        let (a, n) = (self.acceptance, self.drafts_per_row);
        let geometric = if (1.0 - a).abs() < 1e-12 {
            1.0 + n
        } else {
            (1.0 - a.powf(n + 1.0)) / (1.0 - a)
        };
        (1.0 + n * a, geometric)
    }
}

/// Run `concurrency` greedy requests of `prompt_len` prompt tokens and `new_tokens` new
/// tokens each, for every level. Prompts differ per request and level.
pub fn run_bench<B: Backend>(
    engine: &mut Engine<B>,
    prompts: &BenchPrompts,
    levels: &[usize],
    prompt_len: usize,
    new_tokens: usize,
    mut on_level: impl FnMut(&BenchPoint),
) -> Result<Vec<BenchPoint>, EngineError>
where
    B::Tensor: Clone,
{
    let vocab = engine.model().cfg.vocab_size as u64;
    let mut points = Vec::new();
    for (li, &c) in levels.iter().enumerate() {
        let reqs: Vec<Request> = (0..c as u64)
            .map(|i| {
                let prompt = prompts.prompt(li, i, prompt_len, vocab);
                let mut p = GenParams::greedy(new_tokens);
                p.stop_at_eos = false;
                Request::new(i, prompt, p)
            })
            .collect();
        let m0 = engine.metrics();
        let t0 = std::time::Instant::now();
        let outs = engine.generate(reqs)?;
        let wall = t0.elapsed().as_secs_f64();
        let m1 = engine.metrics();
        let generated: usize = outs.iter().map(|o| o.usage.completion_tokens).sum();
        let per_user = outs
            .iter()
            .map(|o| {
                let dt = (o.timing.total_ms - o.timing.ttft_ms) / 1e3;
                if dt > 0.0 {
                    (o.usage.completion_tokens.saturating_sub(1)) as f64 / dt
                } else {
                    0.0
                }
            })
            .sum::<f64>()
            / outs.len().max(1) as f64;
        let steps = (m1.steps - m0.steps).max(1) as f64;
        let d = |f: fn(&super::engine::Metrics) -> f64| f(&m1) - f(&m0);
        let host_thread = d(|m| m.sched_ms) + d(|m| m.build_ms) + d(|m| m.post_ms);
        let host = host_thread + d(|m| m.sample_ms) + d(|m| m.grammar_ms);
        let wall_ms = (wall * 1e3).max(1e-9);
        // Over every decode row, not only those that verified drafts (budgeted speculation
        // gives some rows none).
        let rows = (m1.decode_rows - m0.decode_rows) as f64;
        let p = BenchPoint {
            concurrency: c,
            total_tok_s: generated as f64 / wall.max(1e-9),
            per_user_tok_s: per_user,
            ttft_ms: outs.iter().map(|o| o.timing.ttft_ms).sum::<f64>() / outs.len().max(1) as f64,
            step_ms: wall_ms / steps,
            tokens_per_row: if rows > 0.0 {
                1.0 + (m1.accepted_drafts - m0.accepted_drafts) as f64 / rows
            } else {
                1.0
            },
            host_frac: host / wall_ms,
            hidden_frac: (d(|m| m.hidden_ms) / host_thread.max(1e-9)).min(1.0),
            exposed_frac: (1.0 - (d(|m| m.forward_ms) + d(|m| m.draft_ms)) / wall_ms).max(0.0),
            sample_frac: d(|m| m.sample_ms) / wall_ms,
            acceptance: ratio(
                m1.accepted_drafts - m0.accepted_drafts,
                m1.draft_tokens - m0.draft_tokens,
            ),
            drafts_per_row: ratio(
                m1.draft_tokens - m0.draft_tokens,
                m1.spec_rows - m0.spec_rows,
            ),
            accepted_at: std::array::from_fn(|i| {
                ratio(
                    m1.drafts_accepted_at[i] - m0.drafts_accepted_at[i],
                    m1.drafts_offered_at[i] - m0.drafts_offered_at[i],
                )
            }),
            verified_positions: (0..DRAFT_POSITIONS)
                .take_while(|&i| m1.drafts_offered_at[i] > m0.drafts_offered_at[i])
                .count(),
            accepted_per_row: ratio(
                m1.accepted_drafts - m0.accepted_drafts,
                m1.spec_rows - m0.spec_rows,
            ),
        };
        on_level(&p);
        points.push(p);
    }
    Ok(points)
}

/// `n / d`, or 0 when nothing was counted.
fn ratio(n: u64, d: u64) -> f64 {
    if d == 0 { 0.0 } else { n as f64 / d as f64 }
}

/// The figures as JSON.
pub fn bench_json(points: &[BenchPoint], setup: &Value) -> Value {
    json!({
        "setup": setup,
        "points": points.iter().map(|p| json!({
            "concurrency": p.concurrency, "total_tok_s": p.total_tok_s, "per_user_tok_s": p.per_user_tok_s,
            "ttft_ms": p.ttft_ms, "step_ms": p.step_ms, "tokens_per_row": p.tokens_per_row,
            "host_frac": p.host_frac, "hidden_frac": p.hidden_frac, "exposed_frac": p.exposed_frac,
            "sample_frac": p.sample_frac, "acceptance": p.acceptance,
            "drafts_per_row": p.drafts_per_row,
            "accepted_per_row": p.accepted_per_row,
            "accepted_at": positions(p),
            "claimed_tokens_per_row": {
                "independent": p.claimed_tokens_per_row().0,
                "prefix": p.claimed_tokens_per_row().1,
            },
        })).collect::<Vec<_>>(),
    })
}

/// The per-position acceptance up to the deepest position any row verified.
fn positions(p: &BenchPoint) -> &[f64] {
    &p.accepted_at[..p.verified_positions.min(DRAFT_POSITIONS)]
}

/// A text table.
pub fn bench_table(points: &[BenchPoint]) -> String {
    let mut s = format!(
        "{:>11} {:>12} {:>15} {:>10} {:>10} {:>11} {:>7} {:>9} {:>10} {:>9}\n",
        "concurrency",
        "total tok/s",
        "per-user tok/s",
        "TTFT ms",
        "step ms",
        "tokens/row",
        "host %",
        "hidden %",
        "exposed %",
        "sample %"
    );
    for p in points {
        s.push_str(&format!(
            "{:>11} {:>12.1} {:>15.1} {:>10.1} {:>10.1} {:>11.2} {:>7.1} {:>9.1} {:>10.1} {:>9.1}\n",
            p.concurrency,
            p.total_tok_s,
            p.per_user_tok_s,
            p.ttft_ms,
            p.step_ms,
            p.tokens_per_row,
            100.0 * p.host_frac,
            100.0 * p.hidden_frac,
            100.0 * p.exposed_frac,
            100.0 * p.sample_frac
        ));
    }
    for p in points.iter().filter(|p| p.drafts_per_row > 0.0) {
        let (linear, geometric) = p.claimed_tokens_per_row();
        s.push_str(&format!(
            "concurrency {}: measured {:.2} tokens per decode row; acceptance {:.3} over {:.2} drafts would claim 1 + n·a = {:.2} or 1 + a + … + aⁿ = {:.2}\n",
            p.concurrency, p.tokens_per_row, p.acceptance, p.drafts_per_row, linear, geometric
        ));
        let at: Vec<String> = positions(p).iter().map(|a| format!("{a:.3}")).collect();
        s.push_str(&format!(
            "concurrency {}: {:.2} drafts accepted per verifying row; kept through position 1, 2, …: {}\n",
            p.concurrency,
            p.accepted_per_row,
            at.join(", ")
        ));
    }
    s
}

/// SVG chart: total throughput (y) against per-user speed (x), one line per series (e.g. no
/// drafts, fixed 1-5 drafts, budgeted) and one labelled point per concurrency level, each
/// series' legend entry giving its measured tokens per decode row.
pub fn bench_svg(series: &[(String, Vec<BenchPoint>)], title: &str) -> String {
    const COLOURS: [&str; 8] = [
        "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    ];
    let (w, h, m) = (720.0, 460.0, 60.0);
    let all = || series.iter().flat_map(|(_, p)| p.iter());
    let xmax = all().map(|p| p.per_user_tok_s).fold(1e-9, f64::max) * 1.1;
    let ymax = all().map(|p| p.total_tok_s).fold(1e-9, f64::max) * 1.1;
    let x = |v: f64| m + v / xmax * (w - 2.0 * m);
    let y = |v: f64| h - m - v / ymax * (h - 2.0 * m);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{m}\" y=\"24\" font-size=\"14\">{}</text>\n\
         <line x1=\"{m}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n\
         <line x1=\"{m}\" y1=\"{m}\" x2=\"{m}\" y2=\"{}\" stroke=\"black\"/>\n\
         <text x=\"{}\" y=\"{}\" text-anchor=\"middle\">per-user tokens/s</text>\n\
         <text x=\"16\" y=\"{}\" transform=\"rotate(-90 16 {})\" text-anchor=\"middle\">total tokens/s</text>\n",
        xml_escape(title),
        h - m,
        w - m,
        h - m,
        h - m,
        w / 2.0,
        h - 20.0,
        h / 2.0,
        h / 2.0
    );
    for (k, (label, points)) in series.iter().enumerate() {
        let colour = COLOURS[k % COLOURS.len()];
        let tpr = points.iter().map(|p| p.tokens_per_row).sum::<f64>() / points.len().max(1) as f64;
        s.push_str(&format!(
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"10\" height=\"10\" fill=\"{colour}\"/><text x=\"{:.1}\" y=\"{:.1}\">{}: {tpr:.2} tokens per decode row (measured)</text>\n",
            w - m - 250.0,
            m + 14.0 * k as f64 - 10.0,
            w - m - 235.0,
            m + 14.0 * k as f64,
            xml_escape(label)
        ));
        let pts: Vec<String> = points
            .iter()
            .map(|p| format!("{:.1},{:.1}", x(p.per_user_tok_s), y(p.total_tok_s)))
            .collect();
        s.push_str(&format!(
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" points=\"{}\"/>\n",
            pts.join(" ")
        ));
        for p in points {
            let (px, py) = (x(p.per_user_tok_s), y(p.total_tok_s));
            s.push_str(&format!(
                "<circle cx=\"{px:.1}\" cy=\"{py:.1}\" r=\"4\" fill=\"{colour}\"/><text x=\"{:.1}\" y=\"{:.1}\">{} users: {:.0} tok/s</text>\n",
                px + 6.0,
                py - 6.0,
                p.concurrency,
                p.total_tok_s
            ));
        }
    }
    s.push_str(&format!(
        "<text x=\"{m}\" y=\"{}\">0</text><text x=\"{}\" y=\"{}\" text-anchor=\"end\">{xmax:.0}</text><text x=\"{}\" y=\"{}\" text-anchor=\"end\">{ymax:.0}</text>\n</svg>\n",
        h - m + 16.0,
        w - m,
        h - m + 16.0,
        m - 4.0,
        m + 4.0
    ));
    s
}

fn xml_escape(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_and_svg_show_every_point() {
        let pts = [1usize, 4].map(|c| BenchPoint {
            concurrency: c,
            total_tok_s: 10.0 * c as f64,
            per_user_tok_s: 10.0 / c as f64,
            ttft_ms: 5.0,
            step_ms: 2.0,
            tokens_per_row: 1.0,
            host_frac: 0.25,
            hidden_frac: 0.5,
            exposed_frac: 0.15,
            sample_frac: 0.1,
            acceptance: 0.0,
            drafts_per_row: 0.0,
            accepted_at: [0.0; DRAFT_POSITIONS],
            accepted_per_row: 0.0,
            verified_positions: 0,
        });
        let t = bench_table(&pts);
        assert_eq!(t.lines().count(), 3);
        // With drafts: both readings of the acceptance beside the measured figure.
        let spec = BenchPoint {
            acceptance: 0.5,
            drafts_per_row: 3.0,
            tokens_per_row: 1.6,
            accepted_at: [0.5, 0.25, 0.125, 0.0, 0.0, 0.0, 0.0, 0.0],
            accepted_per_row: 0.875,
            verified_positions: 3,
            ..pts[0]
        };
        let (linear, prefix) = spec.claimed_tokens_per_row();
        assert!((linear - 2.5).abs() < 1e-12 && (prefix - 1.875).abs() < 1e-12);
        let t = bench_table(&[spec]);
        assert!(t.contains("1 + n·a = 2.50") && t.contains("= 1.88"), "{t}");
        assert!(t.contains("position 1, 2, …: 0.500, 0.250, 0.125\n"), "{t}");
        let series = [
            ("no drafts".to_string(), pts.to_vec()),
            ("fixed 3".to_string(), vec![spec]),
        ];
        let svg = bench_svg(&series, "a < b");
        assert!(svg.contains("4 users: 40 tok/s") && svg.contains("a &lt; b"));
        assert!(svg.contains("no drafts: 1.00 tokens per decode row"));
        assert!(svg.contains("fixed 3: 1.60 tokens per decode row"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(
            bench_json(&[spec], &json!({}))["points"][0]["accepted_at"],
            json!([0.5, 0.25, 0.125])
        );
        assert_eq!(
            bench_json(&pts, &json!({}))["points"]
                .as_array()
                .map(Vec::len),
            Some(2)
        );
    }
}
