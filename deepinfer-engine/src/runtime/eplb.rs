//! EPLB in the engine: with expert parallelism, the routed experts are re-placed every
//! `interval` steps from the expert load counted since the last placement, with redundant
//! replicas (one extra slot per rank) by `deepinfer-sched`'s policy: a full placement the
//! first time, then the crate's incremental mode with a bounded number of slot moves.
//!
//! The in-process ranks share the weights, so a move is a swap of the placement table
//! between two steps: no request ever sees a half-moved expert, and outputs do not depend on
//! the placement (every replica computes the same values).

use crate::model::ExpertPlacement;
use deepinfer_sched::{EplbConfig, ExpertLoad, Placement, rebalance, rebalance_incremental};

/// The balancer's state between steps.
#[derive(Debug)]
pub(crate) struct Balancer {
    layers: usize,
    experts: usize,
    ranks: usize,
    interval: usize,
    max_moves: usize,
    /// Counts at the last placement.
    last: Vec<Vec<u64>>,
    current: Option<Placement>,
    /// Placements made.
    pub rebalances: u64,
    /// Slots whose expert changed, over all placements.
    pub moved_slots: u64,
    /// `moe_lb` (mean over layers) of the contiguous split and of the new placement, under
    /// the load the last placement was made from.
    pub last_lb: Option<(f64, f64)>,
}

impl Balancer {
    /// A balancer for `layers × experts` routed experts on `ranks` ranks, re-placing every
    /// `interval` steps and moving at most `max_moves` slots per layer after the first time.
    pub(crate) fn new(
        layers: usize,
        experts: usize,
        ranks: usize,
        interval: usize,
        max_moves: usize,
    ) -> Result<Self, String> {
        if interval == 0 {
            return Err("eplb_interval must be positive".into());
        }
        if ranks < 2 || !experts.is_multiple_of(ranks) {
            return Err(format!(
                "EPLB needs expert parallelism over ranks that split the {experts} experts evenly, not {ranks}"
            ));
        }
        Ok(Self {
            layers,
            experts,
            ranks,
            interval,
            max_moves,
            last: vec![vec![0; experts]; layers],
            current: None,
            rebalances: 0,
            moved_slots: 0,
            last_lb: None,
        })
    }

    /// After step `steps` with `load` counted so far: the new placement when one is due and
    /// tokens were routed since the last.
    pub(crate) fn after_step(
        &mut self,
        steps: u64,
        load: &[Vec<u64>],
    ) -> Result<Option<ExpertPlacement>, String> {
        if !steps.is_multiple_of(self.interval as u64) || load.len() != self.layers {
            return Ok(None);
        }
        let window: Vec<f64> = load
            .iter()
            .zip(&self.last)
            .flat_map(|(now, then)| {
                now.iter()
                    .zip(then)
                    .map(|(&a, &b)| a.saturating_sub(b) as f64)
            })
            .collect();
        if window.iter().all(|&w| w == 0.0) {
            return Ok(None);
        }
        let err = |e: deepinfer_sched::EplbError| format!("EPLB: {e}");
        let w = ExpertLoad::new(self.layers, self.experts, window).map_err(err)?;
        let next = match &self.current {
            None => rebalance(
                &w,
                &EplbConfig {
                    slots: self.experts + self.ranks,
                    groups: 1,
                    nodes: 1,
                    devices: self.ranks,
                },
            )
            .map_err(err)?,
            Some(cur) => {
                let next = rebalance_incremental(&w, cur, self.max_moves).map_err(err)?;
                self.moved_slots += next.moved_from(cur).iter().sum::<usize>() as u64;
                next
            }
        };
        let contiguous: Vec<u32> = (0..self.layers)
            .flat_map(|_| 0..self.experts as u32)
            .collect();
        let contiguous = Placement::from_slots(self.layers, self.experts, self.ranks, contiguous)
            .map_err(err)?;
        self.last_lb = Some((contiguous.moe_lb(&w).mean, next.moe_lb(&w).mean));
        let replicas = (0..self.layers)
            .map(|l| {
                let mut per: Vec<Vec<usize>> = vec![Vec::new(); self.experts];
                for (s, &e) in next.layer(l).iter().enumerate() {
                    let d = next.device_of_slot(s);
                    if let Some(r) = per.get_mut(e as usize)
                        && !r.contains(&d)
                    {
                        r.push(d);
                    }
                }
                per
            })
            .collect();
        let placement =
            ExpertPlacement::from_replicas(self.ranks, replicas).map_err(|e| e.to_string())?;
        self.current = Some(next);
        self.last = load.to_vec();
        self.rebalances += 1;
        Ok(Some(placement))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skewed_load_is_re_placed_and_moves_stay_bounded() {
        let mut b = Balancer::new(2, 4, 2, 3, 1).unwrap();
        let mut load = vec![vec![0u64; 4]; 2];
        assert_eq!(b.after_step(3, &load).unwrap(), None, "no load yet");
        load[0] = vec![90, 5, 3, 2];
        load[1] = vec![10, 10, 10, 10];
        assert_eq!(b.after_step(2, &load).unwrap(), None, "not due");
        let p = b.after_step(3, &load).unwrap().expect("placed");
        // The hot expert of layer 0 gets replicas on both ranks.
        assert_eq!(p.replicas(0, 0).len(), 2, "{p:?}");
        let (before, after) = b.last_lb.unwrap();
        assert!(after < before, "{before} -> {after}");
        load[1] = vec![10, 10, 10, 70];
        b.after_step(6, &load).unwrap().expect("re-placed");
        assert!(
            b.moved_slots <= 2,
            "at most one move per layer: {}",
            b.moved_slots
        );
        assert_eq!(b.rebalances, 2);
        assert!(Balancer::new(2, 4, 3, 3, 1).is_err());
        assert!(Balancer::new(2, 4, 2, 0, 1).is_err());
    }
}
