//! Opt-in timing spans (`DEEPINFER_PROFILE=1`): wall time per named stage of the forward
//! pass, summed over calls, for finding where the time goes without a profiler. Off by
//! default; when off a span costs one relaxed atomic load.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

static STATE: AtomicU8 = AtomicU8::new(0); // 0 unknown, 1 off, 2 on
static TOTALS: Mutex<BTreeMap<&'static str, (Duration, u64)>> = Mutex::new(BTreeMap::new());

fn enabled() -> bool {
    match STATE.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let on = std::env::var_os("DEEPINFER_PROFILE").is_some_and(|v| v != "0");
            STATE.store(if on { 2 } else { 1 }, Ordering::Relaxed);
            on
        }
    }
}

/// A running span; its time is added to its name when dropped.
pub(crate) struct Span(Option<(&'static str, Instant)>);

impl Drop for Span {
    fn drop(&mut self) {
        if let Some((name, t)) = self.0.take() {
            let dt = t.elapsed();
            if let Ok(mut m) = TOTALS.lock() {
                let e = m.entry(name).or_default();
                e.0 += dt;
                e.1 += 1;
            }
        }
    }
}

/// Start a span named `name` (a no-op unless `DEEPINFER_PROFILE` is set).
pub(crate) fn span(name: &'static str) -> Span {
    Span(enabled().then(|| (name, Instant::now())))
}

/// The accumulated spans (`name: total ms over calls`), one per line, and clears them.
/// Empty unless `DEEPINFER_PROFILE` is set. Spans nest, so totals overlap.
pub fn profile_report() -> String {
    let mut m = match TOTALS.lock() {
        Ok(m) => m,
        Err(p) => p.into_inner(),
    };
    let out = m
        .iter()
        .map(|(k, (d, n))| format!("{k:<22} {:>10.3} ms  {n:>7} calls\n", d.as_secs_f64() * 1e3))
        .collect();
    m.clear();
    out
}
