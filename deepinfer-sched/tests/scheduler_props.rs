//! Property tests of the scheduler core against the deterministic fake engine.

use deepinfer_sched::testing::*;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Budgets hold and, whatever the memory pressure, every request ends
    /// finished (with exactly its true tokens) or explicitly aborted.
    #[test]
    fn preemption_never_loses_a_request(w in workload(true, true)) {
        let (done, _, s) = simulate(&w, 0, false);
        check_all_accounted(&w, &done, &s).map_err(TestCaseError::fail)?;
    }

    /// The same with overlapped scheduling.
    #[test]
    fn overlapped_never_loses_a_request(w in workload(true, true)) {
        let (done, _, s) = simulate(&w, 1, false);
        check_all_accounted(&w, &done, &s).map_err(TestCaseError::fail)?;
    }

    /// Overlapped schedule + update gives the same outputs as synchronous scheduling.
    #[test]
    fn overlapped_equals_synchronous(w in workload(false, true)) {
        let (mut a, _, _) = simulate(&w, 0, false);
        let (mut b, _, _) = simulate(&w, 1, false);
        a.sort_by_key(|f| f.id);
        b.sort_by_key(|f| f.id);
        prop_assert_eq!(a, b);
    }

    /// Decode rows answered in the dense form (one token per row): nothing is
    /// lost, synchronous or overlapped, and both give the same outputs.
    #[test]
    fn dense_output_never_loses_a_request(w in workload(true, true)) {
        let (done, _, s) = simulate(&w, 0, true);
        check_all_accounted(&w, &done, &s).map_err(TestCaseError::fail)?;
        let (done, _, s) = simulate(&w, 1, true);
        check_all_accounted(&w, &done, &s).map_err(TestCaseError::fail)?;
    }

    /// Two-step overlap (the plan for step N+2 made while N and N+1 are both
    /// unconfirmed): nothing is lost under memory pressure and aborts, with
    /// either output form.
    #[test]
    fn two_step_overlap_never_loses_a_request(w in workload(true, true)) {
        let (done, _, s) = simulate(&w, 2, false);
        check_all_accounted(&w, &done, &s).map_err(TestCaseError::fail)?;
        let (done, _, s) = simulate(&w, 2, true);
        check_all_accounted(&w, &done, &s).map_err(TestCaseError::fail)?;
    }

    /// Two-step overlap gives the same outputs as synchronous scheduling.
    #[test]
    fn two_step_overlap_equals_synchronous(w in workload(false, true)) {
        let (mut a, _, _) = simulate(&w, 0, false);
        let (mut b, _, _) = simulate(&w, 2, false);
        a.sort_by_key(|f| f.id);
        b.sort_by_key(|f| f.id);
        prop_assert_eq!(a, b);
    }

    /// Requests that arrive while a step computes join the plan made ahead
    /// (`admit_into_planned`): budgets hold, nothing is lost under memory
    /// pressure and aborts, one or two steps ahead, either output form.
    #[test]
    fn late_admission_never_loses_a_request(w in workload(true, true)) {
        for (depth, dense) in [(1, false), (1, true), (2, false)] {
            let (done, _, s) = simulate_arrivals(&w, depth, dense, Arrival::LateAmended);
            check_all_accounted(&w, &done, &s).map_err(TestCaseError::fail)?;
        }
    }

    /// Joining a plan made ahead changes when requests run, not what they produce.
    #[test]
    fn late_admission_equals_synchronous(w in workload(false, true)) {
        let (mut a, _, _) = simulate(&w, 0, false);
        let (mut b, amended, _) = simulate_arrivals(&w, 1, false, Arrival::LateAmended);
        let (_, waited, _) = simulate_arrivals(&w, 1, false, Arrival::Late);
        a.sort_by_key(|f| f.id);
        b.sort_by_key(|f| f.id);
        prop_assert_eq!(a, b);
        // Amended in, the first request to arrive (when it arrives alone, so nothing else
        // competes for the plan) runs a step earlier than when it waits for the plan after
        // the one made ahead.
        let i = (0..w.reqs.len()).min_by_key(|&i| (w.reqs[i].0, i)).unwrap();
        if w.reqs.iter().filter(|r| r.0 == w.reqs[i].0).count() == 1 {
            prop_assert!(amended[i] < waited[i], "{:?} vs {:?}", amended[i], waited[i]);
        }
    }

    /// FCFS: with one priority, requests start in arrival order and all finish.
    #[test]
    fn fcfs_admits_in_order_and_never_starves(w in workload(false, false)) {
        let (done, first, s) = simulate(&w, 0, false);
        check_all_accounted(&w, &done, &s).map_err(TestCaseError::fail)?;
        // Arrival order: by arrival step, then submission index.
        let mut order: Vec<usize> = (0..w.reqs.len()).collect();
        order.sort_by_key(|&i| (w.reqs[i].0, i));
        let starts: Vec<usize> = order.iter().map(|&i| first[i].unwrap()).collect();
        prop_assert!(starts.windows(2).all(|p| p[0] <= p[1]), "starts {:?}", starts);
    }
}
