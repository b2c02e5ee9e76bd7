//! Measured expert load as `deepinfer-sched`'s EPLB sees it: the `moe_lb` (max over mean
//! load per rank) that `N` expert-parallel ranks would have with the experts split
//! contiguously, and with EPLB's placement (one redundant replica per rank) from the same
//! counts. This plans a placement from a run's routing; it does not run experts on other
//! ranks.

use deepinfer_sched::{EplbConfig, ExpertLoad, MoeLb, Placement, rebalance};

/// `moe_lb` of a run's expert load over some ranks, before and after EPLB.
#[derive(Debug, Clone, PartialEq)]
pub struct EplbReport {
    /// Ranks (devices) the experts are spread over.
    pub ranks: usize,
    /// Routed experts per layer.
    pub experts: usize,
    /// Physical slots per layer with EPLB (experts plus one redundant replica per rank).
    pub slots: usize,
    /// Token rows counted over all layers.
    pub routed_rows: u64,
    /// Experts split contiguously, one slot each.
    pub contiguous: MoeLb,
    /// EPLB's placement from the measured load.
    pub eplb: MoeLb,
}

impl EplbReport {
    /// The report as JSON (`moe_lb` means and maxima over layers).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "ranks": self.ranks,
            "experts": self.experts,
            "slots": self.slots,
            "routed_rows": self.routed_rows,
            "moe_lb_contiguous": {"mean": self.contiguous.mean, "max": self.contiguous.max},
            "moe_lb_eplb": {"mean": self.eplb.mean, "max": self.eplb.max},
        })
    }

    /// Two lines for a terminal.
    pub fn table(&self) -> String {
        format!(
            "moe_lb over {} ranks ({} experts, {} routed rows): contiguous mean {:.3} max {:.3}; \
             EPLB with {} slots mean {:.3} max {:.3}\n",
            self.ranks,
            self.experts,
            self.routed_rows,
            self.contiguous.mean,
            self.contiguous.max,
            self.slots,
            self.eplb.mean,
            self.eplb.max
        )
    }
}

/// The report for `load` (`[layer][expert]` token rows, as `Model::expert_load` counts
/// them) over `ranks` ranks. Layers without any load are left out. Errors when the counts
/// are empty or ragged, or the experts do not split evenly over the ranks.
pub fn eplb_report(load: &[Vec<u64>], ranks: usize) -> Result<EplbReport, String> {
    let experts = load.first().map_or(0, Vec::len);
    if ranks == 0 || experts == 0 || load.iter().any(|l| l.len() != experts) {
        return Err(format!(
            "expert load of {} layer(s) with {experts} expert(s) cannot be spread over {ranks} rank(s)",
            load.len()
        ));
    }
    if !experts.is_multiple_of(ranks) {
        return Err(format!(
            "{experts} experts do not split evenly over {ranks} ranks"
        ));
    }
    let used: Vec<&Vec<u64>> = load.iter().filter(|l| l.iter().any(|&c| c > 0)).collect();
    if used.is_empty() {
        return Err("no token was routed while counting".into());
    }
    let data: Vec<f64> = used
        .iter()
        .flat_map(|l| l.iter().map(|&c| c as f64))
        .collect();
    let routed_rows = used.iter().flat_map(|l| l.iter()).sum();
    let load = ExpertLoad::new(used.len(), experts, data).map_err(|e| e.to_string())?;
    let contiguous: Vec<u32> = (0..used.len()).flat_map(|_| 0..experts as u32).collect();
    let contiguous = Placement::from_slots(used.len(), experts, ranks, contiguous)
        .map_err(|e| e.to_string())?
        .moe_lb(&load);
    let slots = experts + ranks;
    let eplb = rebalance(
        &load,
        &EplbConfig {
            slots,
            groups: 1,
            nodes: 1,
            devices: ranks,
        },
    )
    .map_err(|e| e.to_string())?
    .moe_lb(&load);
    Ok(EplbReport {
        ranks,
        experts,
        slots,
        routed_rows,
        contiguous,
        eplb,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skewed_load_is_balanced_by_eplb_and_bad_shapes_are_errors() {
        // One hot expert: with 4 experts on 2 ranks rank 0 holds experts 0 and 1.
        let load = vec![vec![70, 10, 10, 10], vec![0, 0, 0, 0]];
        let r = eplb_report(&load, 2).unwrap();
        // Rank loads 80 and 20: max / mean = 80 / 50.
        assert!((r.contiguous.mean - 1.6).abs() < 1e-12, "{r:?}");
        assert!(r.eplb.max < r.contiguous.max, "{r:?}");
        assert_eq!((r.slots, r.routed_rows), (6, 100));
        assert!(r.table().contains("contiguous mean 1.600"));
        assert_eq!(r.to_json()["moe_lb_contiguous"]["mean"], 1.6);
        assert!(eplb_report(&load, 3).is_err());
        assert!(eplb_report(&load, 0).is_err());
        assert!(eplb_report(&[vec![1, 2], vec![1]], 1).is_err());
        assert!(eplb_report(&[vec![0, 0]], 2).is_err());
        assert!(eplb_report(&[], 2).is_err());
    }
}
