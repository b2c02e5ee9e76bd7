//! Simulator: fixed-5 versus budgeted verification throughput as load grows.
//!
//! `cargo run --release -p deepinfer-spec --example simulate`
//!
//! The step-time curve and the acceptance model are synthetic (see `synthetic.rs` for every
//! assumption); the figures show the *shape* of the trade-off, not any hardware's numbers.

mod synthetic;

use synthetic::{Config, simulate};

fn main() {
    let cfg = Config::default();
    println!(
        "synthetic model: {} drafts per request, {} measured steps per load, ragged overhead {} ms/step",
        cfg.drafts, cfg.steps, cfg.ragged_overhead_ms
    );
    println!(
        "{:>5} {:>12} {:>12} {:>8} {:>12} {:>6} {:>11} {:>9} {:>8}",
        "load",
        "fixed tok/ms",
        "budg tok/ms",
        "budg vs",
        "no-overhead",
        "acc",
        "drafts/req",
        "fixed ms",
        "budg ms"
    );
    for load in [16, 24, 32, 48, 60, 72, 84, 96] {
        let r = simulate(load, &cfg);
        println!(
            "{:>5} {:>12.3} {:>12.3} {:>+7.1}% {:>+11.1}% {:>6.2} {:>11.2} {:>9.2} {:>8.2}",
            r.load,
            r.fixed_tpm,
            r.budgeted_tpm,
            100.0 * (r.budgeted_tpm / r.fixed_tpm - 1.0),
            100.0 * (r.budgeted_free_tpm / r.fixed_tpm - 1.0),
            r.fixed_accepted,
            r.mean_drafts,
            r.fixed_ms,
            r.budgeted_ms,
        );
    }
    println!(
        "budg vs: budgeted over fixed-5 throughput; no-overhead: the same without the ragged \
         overhead; acc: mean drafts accepted per request per step under fixed-5. All synthetic."
    );
}
