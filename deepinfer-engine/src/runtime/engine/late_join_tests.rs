//! A request that arrives while a step computes joins the step planned ahead, which has
//! not launched yet, instead of the one after it.

use super::*;
use crate::runtime::{GenParams, load_default};
use deepinfer_kernels::CpuBackend;

/// What the driver saw, in order.
#[derive(Debug, PartialEq)]
enum Mark {
    /// `wait_step` handed the late request over.
    Submitted,
    /// `wait_step` waited for the step.
    Waited,
    Scheduled(RequestId),
    Finished(RequestId, Vec<u32>),
}

/// Hands `late` over from `wait_step` once request 0 has streamed `after` tokens.
struct LateDriver {
    late: Option<Command>,
    after: usize,
    tokens_of_0: usize,
    log: Vec<Mark>,
    finish_reasons: Vec<(RequestId, FinishReason)>,
}

impl LateDriver {
    fn new(late: Command, after: usize) -> Self {
        Self {
            late: Some(late),
            after,
            tokens_of_0: 0,
            log: Vec::new(),
            finish_reasons: Vec::new(),
        }
    }
}

impl Driver for LateDriver {
    fn event(&mut self, ev: &StreamEvent) -> bool {
        match ev {
            StreamEvent::Token { id: 0, .. } => self.tokens_of_0 += 1,
            StreamEvent::Scheduled { id } => self.log.push(Mark::Scheduled(*id)),
            StreamEvent::Finished(o) => {
                self.finish_reasons.push((o.id, o.finish_reason));
                self.log.push(Mark::Finished(o.id, o.token_ids.clone()))
            }
            _ => {}
        }
        true
    }
    fn poll(&mut self, _wait: bool) -> Option<Vec<Command>> {
        None
    }
    fn wait_step(&mut self, done: &crossbeam_channel::Receiver<()>) -> Option<Vec<Command>> {
        if self.tokens_of_0 >= self.after
            && let Some(c) = self.late.take()
        {
            self.log.push(Mark::Submitted);
            return Some(vec![c]);
        }
        self.log.push(Mark::Waited);
        let _ = done.recv();
        None
    }
    fn rejected(&mut self, id: RequestId, err: EngineError) {
        panic!("request {id} rejected: {err}");
    }
    fn observe(&mut self, _: usize, _: usize, _: &Metrics) {}
}

fn engine() -> Engine<CpuBackend> {
    let model = load_default(CpuBackend::batch_invariant()).unwrap();
    Engine::new(
        model,
        EngineConfig {
            prefix_caching: false,
            ..EngineConfig::default()
        },
    )
    .unwrap()
}

fn request(id: RequestId, prompt: Vec<u32>, new: usize) -> Request {
    let mut p = GenParams::greedy(new);
    p.stop_at_eos = false;
    Request::new(id, prompt, p)
}

#[test]
fn a_request_arriving_mid_step_joins_the_plan_ahead() {
    let late_prompt: Vec<u32> = (0..40).map(|i| 1000 + 37 * i).collect();
    let mut e = engine();
    assert!(e.config().overlap);
    let late = Command::Submit(Box::new(request(7, late_prompt.clone(), 6)));
    let mut d = LateDriver::new(late, 3);
    e.drive(vec![request(0, (100..120).collect(), 16)], &mut d)
        .unwrap();
    // Handed over while a step computed, it was planned before that step ended.
    let at = d.log.iter().position(|m| *m == Mark::Submitted).unwrap();
    assert_eq!(d.log[at + 1], Mark::Scheduled(7), "{:?}", d.log);
    assert_eq!(d.log[at + 2], Mark::Waited, "{:?}", d.log);
    // Every step waits once, so the step computing then was step `in_flight`; the one
    // launched next holds its whole prompt beside request 0's decode row.
    let in_flight = d.log[..at].iter().filter(|m| **m == Mark::Waited).count();
    let next = e.step_history()[in_flight + 1];
    assert_eq!(next.decode_rows, 1, "{next:?}");
    assert_eq!(next.prefill_tokens as usize, late_prompt.len(), "{next:?}");
    // Same tokens as when it runs alone.
    let alone = engine()
        .generate(vec![request(7, late_prompt, 6)])
        .unwrap()
        .remove(0)
        .token_ids;
    let joined = d
        .log
        .iter()
        .find_map(|m| match m {
            Mark::Finished(7, t) => Some(t.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(joined, alone);
}

#[test]
fn an_abort_while_a_step_computes_cancels_the_rows_planned_ahead() {
    let mut e = engine();
    let mut d = LateDriver::new(Command::Abort(0), 3);
    let reqs = vec![
        request(0, (100..120).collect(), 16),
        request(1, (200..230).collect(), 16),
    ];
    e.drive(reqs, &mut d).unwrap();
    let reason = |id| d.finish_reasons.iter().find(|f| f.0 == id).map(|f| f.1);
    assert_eq!(reason(0), Some(FinishReason::Aborted));
    assert_eq!(reason(1), Some(FinishReason::Length));
    let len = |id| {
        d.log.iter().find_map(|m| match m {
            Mark::Finished(i, t) if *i == id => Some(t.len()),
            _ => None,
        })
    };
    assert!(len(0).unwrap() < 16);
    assert_eq!(len(1), Some(16));
    let pool = e.sched.kv().pool();
    assert_eq!(pool.num_free(), pool.num_blocks());
}
