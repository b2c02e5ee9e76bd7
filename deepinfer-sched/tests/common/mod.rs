//! A deterministic fake engine: the token at history position `p` of request `id`
//! is a pure function of `(id, p)`, and so is how many drafts a row accepts. Any
//! correct scheduler therefore produces exactly the same outputs whatever the
//! batching, chunking, preemption or overlap.
#![allow(dead_code)]

use deepinfer_kv::{BlockManager, BlockManagerConfig};
use deepinfer_sched::{
    FinishReason, Finished, NewRequest, RequestId, Scheduler, SchedulerConfig, StepOutput, StepPlan,
};

pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Token sampled at history position `p`.
pub fn token(id: RequestId, p: usize) -> u32 {
    (mix(id.wrapping_mul(1_000_003) ^ p as u64) % 50_000) as u32
}

/// Drafts accepted by a row whose input sits at `p` with `k` drafts.
pub fn accepted(id: RequestId, p: usize, k: usize) -> usize {
    (mix(id ^ (p as u64).wrapping_mul(7919) ^ 0xACCE) % (k as u64 + 1)) as usize
}

pub fn prompt(id: RequestId, len: usize) -> Vec<u32> {
    (0..len).map(|p| token(id, p)).collect()
}

/// Prompts that share a prefix (to exercise prefix hits).
pub fn shared_prompt(id: RequestId, shared: usize, len: usize) -> Vec<u32> {
    (0..len)
        .map(|p| {
            if p < shared {
                token(0, p)
            } else {
                token(id, p)
            }
        })
        .collect()
}

pub fn kv(num_blocks: usize, block_size: usize) -> BlockManager {
    let mut c = BlockManagerConfig::new(num_blocks, block_size);
    c.watermark = 0.0;
    BlockManager::new(c).unwrap()
}

pub fn scheduler(cfg: SchedulerConfig, num_blocks: usize, block_size: usize) -> Scheduler {
    Scheduler::new(cfg, kv(num_blocks, block_size)).unwrap()
}

/// Run a plan on the fake engine. Checks that the KV blocks cover every row.
pub fn run(plan: &StepPlan, s: &Scheduler) -> StepOutput {
    let mut out = StepOutput::new(plan.step);
    let bs = s.kv().block_size();
    for c in &plan.prefill {
        // An aborted request has no KV any more; the engine still runs the plan it got.
        if let Ok(t) = s.kv().block_table(c.request) {
            assert!(t.len() * bs >= c.start + c.len, "no KV for chunk {c:?}");
        }
        if c.samples {
            out.push(c.request, &[token(c.request, c.start + c.len)], false);
        } else {
            out.push(c.request, &[], false);
        }
    }
    for d in &plan.decode {
        assert!(!d.provisional, "engine got a provisional row {d:?}");
        if let Ok(t) = s.kv().block_table(d.request) {
            assert!(
                t.len() * bs > d.position + d.drafts,
                "no KV for decode row {d:?}"
            );
        }
        let m = accepted(d.request, d.position, d.drafts);
        let toks: Vec<u32> = (0..=m)
            .map(|i| token(d.request, d.position + 1 + i))
            .collect();
        out.push(d.request, &toks, false);
    }
    out
}

/// [`run`] answering the decode rows in the dense form (one token per decode
/// row, no accepted drafts), the prefill chunks as row groups.
pub fn run_dense(plan: &StepPlan, s: &Scheduler) -> StepOutput {
    let mut out = StepOutput::new(plan.step);
    let bs = s.kv().block_size();
    for c in &plan.prefill {
        if c.samples {
            out.push_token(c.request, token(c.request, c.start + c.len), false);
        } else {
            out.push(c.request, &[], false);
        }
    }
    for d in &plan.decode {
        assert!(!d.provisional, "engine got a provisional row {d:?}");
        if let Ok(t) = s.kv().block_table(d.request) {
            assert!(t.len() * bs > d.position + d.drafts, "no KV for {d:?}");
        }
        out.push_decode(token(d.request, d.position + 1));
    }
    out
}

/// What each request should output: the pure token stream, cut at `max_new`.
pub fn expected_output(id: RequestId, prompt_len: usize, max_new: usize) -> Vec<u32> {
    (prompt_len..prompt_len + max_new)
        .map(|p| token(id, p))
        .collect()
}

/// Drive synchronously until idle or `max_steps`; returns finished requests and plans.
pub fn drive_sync(s: &mut Scheduler, max_steps: usize) -> (Vec<Finished>, Vec<StepPlan>) {
    let mut done = Vec::new();
    let mut plans = Vec::new();
    for _ in 0..max_steps {
        if s.is_idle() {
            break;
        }
        let plan = s.schedule().unwrap();
        let out = run(&plan, s);
        let res = s.update(&out).unwrap();
        done.extend(res.finished);
        plans.push(plan);
    }
    (done, plans)
}

/// Drive with overlapped scheduling: plan N+1 before N's output is applied.
pub fn drive_async(s: &mut Scheduler, max_steps: usize) -> (Vec<Finished>, Vec<StepPlan>) {
    let mut done = Vec::new();
    let mut plans = Vec::new();
    let mut cur = s.schedule().unwrap();
    for _ in 0..max_steps {
        let out = run(&cur, s);
        let mut next = s.schedule().unwrap();
        let res = s.update(&out).unwrap();
        done.extend(res.finished.iter().cloned());
        res.apply_to(&mut next);
        plans.push(std::mem::replace(&mut cur, next));
        if s.is_idle() {
            // Drain the last (now empty or cancelled) plan.
            let out = run(&cur, s);
            let res = s.update(&out).unwrap();
            done.extend(res.finished);
            break;
        }
    }
    (done, plans)
}

pub fn req(id: RequestId, len: usize, max_new: usize) -> NewRequest {
    NewRequest::new(id, prompt(id, len), max_new)
}

pub fn check_outputs(done: &[Finished], reqs: &[(RequestId, usize, usize)]) {
    for &(id, len, max_new) in reqs {
        let f: Vec<&Finished> = done.iter().filter(|f| f.id == id).collect();
        assert_eq!(f.len(), 1, "request {id} finished {} times", f.len());
        if f[0].reason != FinishReason::Aborted {
            assert_eq!(f[0].reason, FinishReason::Length);
            assert_eq!(
                f[0].output(),
                expected_output(id, len, max_new),
                "request {id}"
            );
        }
    }
}
