//! `GET /metrics`: Prometheus text under vLLM's names where the meaning is the same, so
//! existing dashboards work. One recorder per server (not the process-wide one), so several
//! servers in one process keep their own figures.

use crate::runtime::{FinishReason, OnlineStats, Output};
use metrics::{Recorder, counter, gauge, histogram, with_local_recorder};
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};
use std::time::Duration;

/// Latency buckets, s (vLLM's for time to first token, extended down for a small model).
const LATENCY_BUCKETS: [f64; 19] = [
    0.0005, 0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0,
];

/// The server's recorder and its renderer.
pub struct ServerMetrics {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
}

impl std::fmt::Debug for ServerMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerMetrics").finish_non_exhaustive()
    }
}

impl Default for ServerMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl ServerMetrics {
    /// A fresh recorder (histograms with latency buckets).
    pub fn new() -> Self {
        let builder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &LATENCY_BUCKETS)
            .unwrap_or_else(|_| PrometheusBuilder::new());
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        let m = Self { recorder, handle };
        m.with(|| {
            for (name, what) in [
                (
                    "vllm:prompt_tokens_total",
                    "Prompt tokens of finished requests.",
                ),
                (
                    "vllm:generation_tokens_total",
                    "Generated tokens of finished requests.",
                ),
                (
                    "vllm:prefix_cache_queries",
                    "Prompt tokens looked up in the prefix cache.",
                ),
                (
                    "vllm:prefix_cache_hits",
                    "Prompt tokens served by the prefix cache.",
                ),
                ("vllm:num_preemptions", "Preemptions."),
                (
                    "vllm:spec_decode_num_draft_tokens",
                    "Draft tokens proposed.",
                ),
                (
                    "vllm:spec_decode_num_accepted_tokens",
                    "Draft tokens accepted.",
                ),
                (
                    "vllm:request_success",
                    "Finished requests, by finish reason.",
                ),
            ] {
                metrics::describe_counter!(name, what);
            }
            metrics::describe_gauge!("vllm:num_requests_running", "Sequences in the batch.");
            metrics::describe_gauge!("vllm:num_requests_waiting", "Sequences waiting.");
            metrics::describe_histogram!(
                "vllm:time_to_first_token_seconds",
                "Arrival to first token."
            );
            metrics::describe_histogram!(
                "vllm:inter_token_latency_seconds",
                "Time between two tokens of a request."
            );
            metrics::describe_histogram!(
                "vllm:request_queue_time_seconds",
                "Arrival to the first step that plans the request."
            );
            metrics::describe_histogram!(
                "vllm:e2e_request_latency_seconds",
                "Arrival to the last token."
            );
        });
        m
    }

    fn with<T>(&self, f: impl FnOnce() -> T) -> T {
        with_local_recorder(&self.recorder as &dyn Recorder, f)
    }

    /// A request was first planned into a step `d` after its arrival.
    pub fn queue_time(&self, d: Duration) {
        self.with(|| histogram!("vllm:request_queue_time_seconds").record(d.as_secs_f64()));
    }

    /// A request's first token came `d` after its arrival.
    pub fn ttft(&self, d: Duration) {
        self.with(|| histogram!("vllm:time_to_first_token_seconds").record(d.as_secs_f64()));
    }

    /// Two tokens of a request came `d` apart.
    pub fn inter_token(&self, d: Duration) {
        self.with(|| histogram!("vllm:inter_token_latency_seconds").record(d.as_secs_f64()));
    }

    /// A request finished (all its samples) `e2e` after its arrival.
    pub fn finished(&self, outs: &[Output], e2e: Duration) {
        let Some(first) = outs.first() else {
            return;
        };
        let generated: usize = outs.iter().map(|o| o.usage.completion_tokens).sum();
        self.with(|| {
            counter!("vllm:prompt_tokens_total").increment(first.usage.prompt_tokens as u64);
            counter!("vllm:generation_tokens_total").increment(generated as u64);
            counter!("vllm:prefix_cache_queries").increment(first.usage.prompt_tokens as u64);
            counter!("vllm:prefix_cache_hits").increment(first.usage.cached_tokens as u64);
            histogram!("vllm:e2e_request_latency_seconds").record(e2e.as_secs_f64());
            for o in outs {
                let reason = match o.finish_reason {
                    FinishReason::Aborted => "abort",
                    FinishReason::Length => "length",
                    _ => "stop",
                };
                counter!("vllm:request_success", "finished_reason" => reason).increment(1);
            }
        });
    }

    /// The text exposition, with the engine's gauges and totals as of now.
    pub fn render(&self, s: &OnlineStats) -> String {
        self.with(|| {
            gauge!("vllm:num_requests_running").set(s.running as f64);
            gauge!("vllm:num_requests_waiting").set(s.waiting as f64);
            counter!("vllm:num_preemptions").absolute(s.preemptions);
            counter!("vllm:spec_decode_num_draft_tokens").absolute(s.draft_tokens);
            counter!("vllm:spec_decode_num_accepted_tokens").absolute(s.accepted_drafts);
        });
        self.handle.render()
    }
}
