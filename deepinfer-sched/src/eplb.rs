//! Expert-parallel load balancing (EPLB).
//!
//! Input: the load of every logical expert in every MoE layer (tokens routed
//! to it over a window). Output: a [`Placement`] of physical expert slots, each
//! slot holding one replica of one logical expert, `slots / devices` slots per
//! device. The load of an expert is assumed to split evenly across its replicas.
//!
//! * Full rebalance ([`rebalance`]): extra replicas go greedily to the expert with
//!   the highest load per replica; replicas are packed onto devices with the
//!   heaviest first, each into the least-loaded device that still has a free
//!   slot, so every device ends with exactly the same slot count. When the node
//!   count divides the group count the packing is hierarchical (expert groups →
//!   nodes, then replication and device packing inside each node, so an expert
//!   group's traffic stays inside one node); otherwise it is global.
//! * Incremental rebalance ([`rebalance_incremental`]): starting from the current
//!   placement, apply at most `max_moves` slot rewrites per layer, each chosen
//!   greedily for the largest drop of the heaviest device's load: either move a
//!   spare replica of a cold expert to a hot one, or swap two replicas between
//!   the heaviest and the lightest device. Weight transfers are expensive, so
//!   this trades balance for bounded movement.
//!
//! [`Placement::moe_lb`] reports max/mean device load (DeepSeek reports 1.090 in
//! decode for its production placement).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use thiserror::Error;

/// Errors from the balancer.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum EplbError {
    /// A count is zero.
    #[error("{0} must be positive")]
    Zero(&'static str),
    /// Shapes do not divide as the placement requires.
    #[error("invalid shape: {0}")]
    Shape(String),
    /// A load is negative or not finite.
    #[error("load of layer {layer} expert {expert} is {value}, must be finite and >= 0")]
    BadLoad {
        /// Layer index.
        layer: usize,
        /// Expert index.
        expert: usize,
        /// Offending value.
        value: f64,
    },
    /// A given placement is not valid for the configuration.
    #[error("invalid placement: {0}")]
    InvalidPlacement(String),
}

/// Per-layer, per-expert load statistics (row-major `layers × experts`).
#[derive(Debug, Clone, PartialEq)]
pub struct ExpertLoad {
    layers: usize,
    experts: usize,
    data: Vec<f64>,
}

impl ExpertLoad {
    /// Wrap row-major loads; every value must be finite and non-negative.
    pub fn new(layers: usize, experts: usize, data: Vec<f64>) -> Result<Self, EplbError> {
        if layers == 0 {
            return Err(EplbError::Zero("layers"));
        }
        if experts == 0 {
            return Err(EplbError::Zero("experts"));
        }
        if data.len() != layers * experts {
            return Err(EplbError::Shape(format!(
                "{} loads for {layers} layers × {experts} experts",
                data.len()
            )));
        }
        if let Some(i) = data.iter().position(|v| !(v.is_finite() && *v >= 0.0)) {
            return Err(EplbError::BadLoad {
                layer: i / experts,
                expert: i % experts,
                value: data[i],
            });
        }
        Ok(Self {
            layers,
            experts,
            data,
        })
    }

    /// Number of layers.
    pub fn layers(&self) -> usize {
        self.layers
    }

    /// Number of logical experts per layer.
    pub fn experts(&self) -> usize {
        self.experts
    }

    /// Loads of one layer.
    pub fn layer(&self, l: usize) -> &[f64] {
        &self.data[l * self.experts..(l + 1) * self.experts]
    }
}

/// The physical layout to balance onto.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EplbConfig {
    /// Physical expert slots per layer (logical experts + redundant replicas).
    pub slots: usize,
    /// Expert groups (contiguous blocks of logical experts; 1 if the model has none).
    pub groups: usize,
    /// Nodes (servers).
    pub nodes: usize,
    /// Devices in total (a multiple of `nodes`).
    pub devices: usize,
}

impl EplbConfig {
    /// Whether [`rebalance`] uses the hierarchical policy for this configuration.
    pub fn is_hierarchical(&self) -> bool {
        self.nodes > 1 && self.groups.is_multiple_of(self.nodes)
    }

    fn check(&self, experts: usize) -> Result<(), EplbError> {
        for (name, v) in [
            ("slots", self.slots),
            ("groups", self.groups),
            ("nodes", self.nodes),
            ("devices", self.devices),
        ] {
            if v == 0 {
                return Err(EplbError::Zero(name));
            }
        }
        if self.slots < experts {
            return Err(EplbError::Shape(format!(
                "{} slots cannot hold {experts} experts",
                self.slots
            )));
        }
        if !self.slots.is_multiple_of(self.devices) {
            return Err(EplbError::Shape(format!(
                "{} slots do not split evenly over {} devices",
                self.slots, self.devices
            )));
        }
        if self.is_hierarchical() {
            if !experts.is_multiple_of(self.groups) {
                return Err(EplbError::Shape(format!(
                    "{experts} experts do not split into {} groups",
                    self.groups
                )));
            }
            if !self.devices.is_multiple_of(self.nodes) {
                return Err(EplbError::Shape(format!(
                    "{} devices do not split over {} nodes",
                    self.devices, self.nodes
                )));
            }
        }
        Ok(())
    }
}

/// A placement: which logical expert each physical slot holds, per layer.
/// Device `d` owns slots `d·k .. (d+1)·k` with `k = slots / devices`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    layers: usize,
    experts: usize,
    slots: usize,
    devices: usize,
    slot_expert: Vec<u32>,
}

/// Load-balance figures of a placement under a load.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeLb {
    /// max / mean device load of each layer (1.0 for a layer with no load).
    pub per_layer: Vec<f64>,
    /// Mean over layers.
    pub mean: f64,
    /// Worst layer.
    pub max: f64,
}

impl Placement {
    /// Build from row-major `layers × slots` expert ids, validating it.
    pub fn from_slots(
        layers: usize,
        experts: usize,
        devices: usize,
        slot_expert: Vec<u32>,
    ) -> Result<Self, EplbError> {
        if layers == 0 || devices == 0 || experts == 0 {
            return Err(EplbError::Zero("layers, experts and devices"));
        }
        if !slot_expert.len().is_multiple_of(layers) {
            return Err(EplbError::InvalidPlacement(
                "length not a multiple of layers".into(),
            ));
        }
        let p = Self {
            layers,
            experts,
            slots: slot_expert.len() / layers,
            devices,
            slot_expert,
        };
        p.validate()?;
        Ok(p)
    }

    /// Check: equal slot counts per device and every logical expert has a replica.
    pub fn validate(&self) -> Result<(), EplbError> {
        if self.slots == 0 || !self.slots.is_multiple_of(self.devices) {
            return Err(EplbError::InvalidPlacement(format!(
                "{} slots over {} devices",
                self.slots, self.devices
            )));
        }
        for l in 0..self.layers {
            let counts = self.replica_counts(l);
            if let Some(e) = counts.iter().position(|&c| c == 0) {
                return Err(EplbError::InvalidPlacement(format!(
                    "layer {l}: expert {e} has no replica"
                )));
            }
            if self.layer(l).iter().any(|&e| e as usize >= self.experts) {
                return Err(EplbError::InvalidPlacement(format!(
                    "layer {l}: unknown expert id"
                )));
            }
        }
        Ok(())
    }

    /// Number of layers.
    pub fn layers(&self) -> usize {
        self.layers
    }

    /// Number of logical experts.
    pub fn experts(&self) -> usize {
        self.experts
    }

    /// Physical slots per layer.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Devices.
    pub fn devices(&self) -> usize {
        self.devices
    }

    /// Slots per device.
    pub fn slots_per_device(&self) -> usize {
        self.slots / self.devices
    }

    /// Logical expert of every slot of a layer.
    pub fn layer(&self, l: usize) -> &[u32] {
        &self.slot_expert[l * self.slots..(l + 1) * self.slots]
    }

    /// Device that owns a slot.
    pub fn device_of_slot(&self, slot: usize) -> usize {
        slot / self.slots_per_device()
    }

    /// Replica count of every logical expert in a layer.
    pub fn replica_counts(&self, l: usize) -> Vec<u32> {
        let mut c = vec![0u32; self.experts];
        for &e in self.layer(l) {
            if let Some(v) = c.get_mut(e as usize) {
                *v += 1;
            }
        }
        c
    }

    /// Physical slots of each logical expert in a layer (the routing table).
    pub fn expert_slots(&self, l: usize) -> Vec<Vec<u32>> {
        let mut m = vec![Vec::new(); self.experts];
        for (s, &e) in self.layer(l).iter().enumerate() {
            m[e as usize].push(s as u32);
        }
        m
    }

    /// Load of every device in a layer, each expert's load split evenly across its replicas.
    pub fn device_loads(&self, l: usize, load: &ExpertLoad) -> Vec<f64> {
        let counts = self.replica_counts(l);
        let w = load.layer(l);
        let k = self.slots_per_device();
        let mut dev = vec![0.0; self.devices];
        for (s, &e) in self.layer(l).iter().enumerate() {
            dev[s / k] += w[e as usize] / counts[e as usize] as f64;
        }
        dev
    }

    /// max / mean device load per layer, and its mean and max over layers.
    pub fn moe_lb(&self, load: &ExpertLoad) -> MoeLb {
        let per_layer: Vec<f64> = (0..self.layers)
            .map(|l| imbalance(&self.device_loads(l, load)))
            .collect();
        let mean = per_layer.iter().sum::<f64>() / per_layer.len() as f64;
        let max = per_layer.iter().copied().fold(1.0, f64::max);
        MoeLb {
            per_layer,
            mean,
            max,
        }
    }

    /// Number of slots per layer whose expert differs from `other` (weights to move).
    pub fn moved_from(&self, other: &Placement) -> Vec<usize> {
        (0..self.layers)
            .map(|l| {
                self.layer(l)
                    .iter()
                    .zip(other.layer(l))
                    .filter(|(a, b)| a != b)
                    .count()
            })
            .collect()
    }
}

fn imbalance(dev: &[f64]) -> f64 {
    let mean = dev.iter().sum::<f64>() / dev.len() as f64;
    if mean <= 0.0 {
        return 1.0;
    }
    dev.iter().copied().fold(0.0, f64::max) / mean
}

/// Total order on f64 for heaps (loads are validated finite).
#[derive(Clone, Copy, PartialEq)]
struct Key(f64);
impl Eq for Key {}
impl PartialOrd for Key {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Key {
    fn cmp(&self, o: &Self) -> Ordering {
        self.0.total_cmp(&o.0)
    }
}

/// Assign weighted items to `packs` packs of exactly `per_pack` items each:
/// heaviest first, each into the lightest pack with room. Returns the pack of
/// every item. `items.len()` must equal `packs · per_pack`.
fn balanced_packing(weights: &[f64], packs: usize, per_pack: usize) -> Vec<usize> {
    debug_assert_eq!(weights.len(), packs * per_pack);
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_unstable_by(|&a, &b| weights[b].total_cmp(&weights[a]).then(a.cmp(&b)));
    // Min-heap on (load, pack); a full pack is simply not pushed back.
    let mut heap: BinaryHeap<std::cmp::Reverse<(Key, usize)>> = (0..packs)
        .map(|p| std::cmp::Reverse((Key(0.0), p)))
        .collect();
    let mut fill = vec![0usize; packs];
    let mut out = vec![0usize; weights.len()];
    for i in order {
        let Some(std::cmp::Reverse((Key(load), p))) = heap.pop() else {
            break;
        };
        out[i] = p;
        fill[p] += 1;
        if fill[p] < per_pack {
            heap.push(std::cmp::Reverse((Key(load + weights[i]), p)));
        }
    }
    out
}

/// Replica counts for `weights` over `slots` slots: one each, then every extra
/// one to the expert with the highest load per replica.
fn replicate(weights: &[f64], slots: usize) -> Vec<u32> {
    let mut cnt = vec![1u32; weights.len()];
    let mut heap: BinaryHeap<(Key, std::cmp::Reverse<usize>)> = weights
        .iter()
        .enumerate()
        .map(|(i, &w)| (Key(w), std::cmp::Reverse(i)))
        .collect();
    for _ in weights.len()..slots {
        let Some((_, std::cmp::Reverse(i))) = heap.pop() else {
            break;
        };
        cnt[i] += 1;
        heap.push((Key(weights[i] / cnt[i] as f64), std::cmp::Reverse(i)));
    }
    cnt
}

/// Replicate `experts` (logical ids with their loads) into `slots` and pack them
/// onto `devices` devices; writes slot contents into `out` (device-major).
fn place_into(experts: &[usize], w: &[f64], devices: usize, out: &mut [u32]) {
    let slots = out.len();
    let sub: Vec<f64> = experts.iter().map(|&e| w[e]).collect();
    let cnt = replicate(&sub, slots);
    let mut rep_expert = Vec::with_capacity(slots);
    let mut rep_w = Vec::with_capacity(slots);
    for (i, &c) in cnt.iter().enumerate() {
        for _ in 0..c {
            rep_expert.push(experts[i] as u32);
            rep_w.push(sub[i] / c as f64);
        }
    }
    let per = slots / devices;
    let dev = balanced_packing(&rep_w, devices, per);
    let mut fill = vec![0usize; devices];
    for (r, &d) in dev.iter().enumerate() {
        out[d * per + fill[d]] = rep_expert[r];
        fill[d] += 1;
    }
}

/// Full rebalance of every layer.
pub fn rebalance(load: &ExpertLoad, cfg: &EplbConfig) -> Result<Placement, EplbError> {
    let e = load.experts();
    cfg.check(e)?;
    let mut slot_expert = vec![0u32; load.layers() * cfg.slots];
    let hier = cfg.is_hierarchical();
    if hier && !cfg.slots.is_multiple_of(cfg.nodes) {
        return Err(EplbError::Shape("slots do not split over nodes".into()));
    }
    for l in 0..load.layers() {
        let w = load.layer(l);
        let out = &mut slot_expert[l * cfg.slots..(l + 1) * cfg.slots];
        if hier {
            let gsize = e / cfg.groups;
            let group_w: Vec<f64> = (0..cfg.groups)
                .map(|g| w[g * gsize..(g + 1) * gsize].iter().sum())
                .collect();
            let node_of_group = balanced_packing(&group_w, cfg.nodes, cfg.groups / cfg.nodes);
            let slots_per_node = cfg.slots / cfg.nodes;
            let experts_per_node = e / cfg.nodes;
            if slots_per_node < experts_per_node {
                return Err(EplbError::Shape(format!(
                    "{slots_per_node} slots per node cannot hold {experts_per_node} experts"
                )));
            }
            for n in 0..cfg.nodes {
                let members: Vec<usize> = (0..cfg.groups)
                    .filter(|&g| node_of_group[g] == n)
                    .flat_map(|g| g * gsize..(g + 1) * gsize)
                    .collect();
                place_into(
                    &members,
                    w,
                    cfg.devices / cfg.nodes,
                    &mut out[n * slots_per_node..(n + 1) * slots_per_node],
                );
            }
        } else {
            let all: Vec<usize> = (0..e).collect();
            place_into(&all, w, cfg.devices, out);
        }
    }
    Ok(Placement {
        layers: load.layers(),
        experts: e,
        slots: cfg.slots,
        devices: cfg.devices,
        slot_expert,
    })
}

/// Incremental rebalance: at most `max_moves` slot rewrites per layer relative to `current`.
pub fn rebalance_incremental(
    load: &ExpertLoad,
    current: &Placement,
    max_moves: usize,
) -> Result<Placement, EplbError> {
    if current.layers != load.layers() || current.experts != load.experts() {
        return Err(EplbError::Shape(format!(
            "placement is {}×{} but load is {}×{}",
            current.layers,
            current.experts,
            load.layers(),
            load.experts()
        )));
    }
    current.validate()?;
    let mut next = current.clone();
    let k = current.slots_per_device();
    for l in 0..load.layers() {
        let w = load.layer(l);
        let slots = &mut next.slot_expert[l * current.slots..(l + 1) * current.slots];
        improve_layer(w, slots, current.devices, k, max_moves);
    }
    Ok(next)
}

/// Greedy local search on one layer; each accepted step strictly lowers the
/// heaviest device's load and costs one (replica move) or two (swap) rewrites.
#[allow(clippy::needless_range_loop)] // slot indices double as device arithmetic
fn improve_layer(w: &[f64], slots: &mut [u32], devices: usize, k: usize, budget: usize) {
    let experts = w.len();
    let mut cnt = vec![0u32; experts];
    for &e in slots.iter() {
        cnt[e as usize] += 1;
    }
    let mut dev = vec![0.0f64; devices];
    const TOP: usize = 8;
    let mut order: Vec<usize> = Vec::with_capacity(TOP);
    // Slots of each expert, CSR style (rebuilt per accepted step: cheap, O(slots)).
    let mut start = vec![0usize; experts + 1];
    let mut fill = vec![0usize; experts + 1];
    let mut members = vec![0u32; slots.len()];
    let mut changed: Vec<(usize, f64)> = Vec::new();
    // Load per replica of each expert; only the two experts a move touches change.
    let mut per_e: Vec<f64> = (0..experts)
        .map(|e| {
            if cnt[e] == 0 {
                0.0
            } else {
                w[e] / cnt[e] as f64
            }
        })
        .collect();
    let mut left = budget;
    while left > 0 {
        let per = |e: u32| per_e[e as usize];
        // Device-major, so no division per slot.
        for (d, v) in dev.iter_mut().enumerate() {
            *v = slots[d * k..(d + 1) * k]
                .iter()
                .fold(0.0, |a, &e| a + per(e));
        }
        // The TOP heaviest devices, heaviest first (a full sort per step cost
        // more than the rest of the step), and the lightest one.
        order.clear();
        let mut dmin = 0;
        for d in 0..devices {
            if dev[d].total_cmp(&dev[dmin]).is_lt() {
                dmin = d;
            }
            if order.len() < TOP
                || order
                    .last()
                    .is_some_and(|&o| dev[d].total_cmp(&dev[o]).is_gt())
            {
                if order.len() == TOP {
                    order.pop();
                }
                let pos = order
                    .iter()
                    .position(|&o| dev[d].total_cmp(&dev[o]).is_gt())
                    .unwrap_or(order.len());
                order.insert(pos, d);
            }
        }
        let dmax = order[0];
        let (lmax, lmin) = (dev[dmax], dev[dmin]);
        if dmax == dmin || lmax <= 0.0 {
            break;
        }
        start.iter_mut().for_each(|v| *v = 0);
        for &e in slots.iter() {
            start[e as usize + 1] += 1;
        }
        for e in 0..experts {
            start[e + 1] += start[e];
        }
        fill.copy_from_slice(&start);
        for (s, &e) in slots.iter().enumerate() {
            members[fill[e as usize]] = s as u32;
            fill[e as usize] += 1;
        }
        let others_max = order
            .iter()
            .find(|&&d| d != dmax && d != dmin)
            .map_or(f64::NEG_INFINITY, |&d| dev[d]);
        // Best candidate: (new max, cost, s, t, kind) with kind 0 = swap(s, t),
        // 1 = overwrite t with a new replica of the expert in s.
        let mut best: Option<(f64, usize, usize, usize, u8)> = None;
        let mut consider = |new_max: f64, cost: usize, s: usize, t: usize, kind: u8| {
            if cost > left || new_max >= lmax * (1.0 - 1e-12) {
                return;
            }
            // Gain per rewrite, so a one-slot move can beat a slightly better swap.
            let gain = (lmax - new_max) / cost as f64;
            if best.is_none_or(|b| gain > (lmax - b.0) / b.1 as f64) {
                best = Some((new_max, cost, s, t, kind));
            }
        };
        for s in dmax * k..(dmax + 1) * k {
            let es = slots[s];
            let ws = per(es);
            for t in dmin * k..(dmin + 1) * k {
                let et = slots[t];
                if es == et {
                    continue;
                }
                let wt = per(et);
                let m = others_max.max(lmax - ws + wt).max(lmin + ws - wt);
                consider(m, 2, s, t, 0);
                if cnt[et as usize] < 2 {
                    continue;
                }
                // Overwrite t with a new replica of es: every replica of es gets
                // lighter, the remaining replicas of et heavier. Only the devices
                // holding them change.
                let (ce, ct) = (cnt[es as usize] as f64, cnt[et as usize] as f64);
                let (we, wtt) = (w[es as usize], w[et as usize]);
                changed.clear();
                let mut bump = |d: usize, delta: f64| match changed.iter_mut().find(|c| c.0 == d) {
                    Some(c) => c.1 += delta,
                    None => changed.push((d, delta)),
                };
                for &u in &members[start[es as usize]..start[es as usize + 1]] {
                    bump(u as usize / k, we / (ce + 1.0) - we / ce);
                }
                for &u in &members[start[et as usize]..start[et as usize + 1]] {
                    if u as usize != t {
                        bump(u as usize / k, wtt / (ct - 1.0) - wtt / ct);
                    }
                }
                bump(dmin, we / (ce + 1.0) - wtt / ct);
                let untouched = |d: &usize| !changed.iter().any(|c| c.0 == *d);
                let mut m = match order.iter().find(|d| untouched(d)) {
                    Some(&d) => dev[d],
                    // Every listed device changes: scan them all.
                    None => (0..devices)
                        .filter(untouched)
                        .map(|d| dev[d])
                        .fold(f64::NEG_INFINITY, f64::max),
                };
                for &(d, delta) in &changed {
                    m = m.max(dev[d] + delta);
                }
                consider(m, 1, s, t, 1);
            }
        }
        let Some((_, cost, s, t, kind)) = best else {
            break;
        };
        if kind == 0 {
            slots.swap(s, t);
        } else {
            let (es, et) = (slots[s] as usize, slots[t] as usize);
            cnt[et] -= 1;
            cnt[es] += 1;
            slots[t] = slots[s];
            per_e[es] = w[es] / cnt[es] as f64;
            per_e[et] = w[et] / cnt[et] as f64;
        }
        left -= cost;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_is_exactly_equal() {
        let w = [9.0, 1.0, 1.0, 1.0, 5.0, 5.0];
        let p = balanced_packing(&w, 2, 3);
        let mut fill = [0; 2];
        let mut load = [0.0; 2];
        for (i, &d) in p.iter().enumerate() {
            fill[d] += 1;
            load[d] += w[i];
        }
        assert_eq!(fill, [3, 3]);
        assert_eq!(load[0].max(load[1]), 11.0);
    }

    #[test]
    fn hot_expert_gets_the_replicas() {
        let c = replicate(&[100.0, 1.0, 1.0, 1.0], 7);
        assert_eq!(c, vec![4, 1, 1, 1]);
    }

    #[test]
    fn shapes_are_checked() {
        let load = ExpertLoad::new(1, 4, vec![1.0; 4]).unwrap();
        let bad = EplbConfig {
            slots: 3,
            groups: 1,
            nodes: 1,
            devices: 1,
        };
        assert!(rebalance(&load, &bad).is_err());
        let uneven = EplbConfig {
            slots: 6,
            groups: 1,
            nodes: 1,
            devices: 4,
        };
        assert!(rebalance(&load, &uneven).is_err());
        assert!(ExpertLoad::new(1, 2, vec![1.0, -1.0]).is_err());
        assert!(ExpertLoad::new(1, 2, vec![1.0]).is_err());
    }

    #[test]
    fn hierarchical_keeps_groups_on_one_node() {
        // 8 experts in 4 groups of 2, 2 nodes of 2 devices, 12 slots.
        let w: Vec<f64> = (0..8).map(|i| (i * 7 % 5 + 1) as f64).collect();
        let load = ExpertLoad::new(1, 8, w).unwrap();
        let cfg = EplbConfig {
            slots: 12,
            groups: 4,
            nodes: 2,
            devices: 4,
        };
        assert!(cfg.is_hierarchical());
        let p = rebalance(&load, &cfg).unwrap();
        p.validate().unwrap();
        for n in 0..2 {
            let on_node: Vec<u32> = p.layer(0)[n * 6..(n + 1) * 6].to_vec();
            for &e in &on_node {
                // The partner of expert e in its group is on the same node.
                let partner = e ^ 1;
                assert!(
                    on_node.contains(&partner),
                    "group of {e} split across nodes"
                );
            }
        }
    }
}
