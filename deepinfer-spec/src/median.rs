//! Windowed running median, used to correct the step-time model per bucket.

/// Median of the last `capacity` observations.
///
/// A median (not a mean) so that an occasional slow step (a page fault, a straggling
/// collective) does not drag the correction. Updating costs `O(capacity)`: it is done once per
/// engine step, off the planning path.
#[derive(Debug, Clone)]
pub struct RunningMedian {
    ring: Vec<f64>,
    next: usize,
    capacity: usize,
    median: f64,
    scratch: Vec<f64>,
}

impl RunningMedian {
    /// An empty window holding at most `capacity` (≥ 1) observations.
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            ring: Vec::with_capacity(capacity),
            next: 0,
            capacity,
            median: f64::NAN,
            scratch: Vec::with_capacity(capacity),
        }
    }

    /// Adds one observation, evicting the oldest when the window is full.
    pub fn push(&mut self, value: f64) {
        if self.ring.len() < self.capacity {
            self.ring.push(value);
        } else {
            self.ring[self.next] = value;
        }
        self.next = (self.next + 1) % self.capacity;
        self.scratch.clear();
        self.scratch.extend_from_slice(&self.ring);
        let n = self.scratch.len();
        let mid = n / 2;
        let (_, upper, _) = self.scratch.select_nth_unstable_by(mid, f64::total_cmp);
        let upper = *upper;
        self.median = if n % 2 == 1 {
            upper
        } else {
            // The lower middle is the largest of the left part.
            let lower = self.scratch[..mid]
                .iter()
                .copied()
                .fold(f64::NEG_INFINITY, f64::max);
            0.5 * (lower + upper)
        };
    }

    /// Number of observations currently in the window.
    pub fn len(&self) -> usize {
        self.ring.len()
    }

    /// The most observations the window holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Whether nothing has been observed yet.
    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }

    /// The median of the window, `None` before the first observation.
    pub fn median(&self) -> Option<f64> {
        (!self.ring.is_empty()).then_some(self.median)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_even_and_window() {
        let mut m = RunningMedian::new(3);
        assert_eq!(m.median(), None);
        m.push(5.0);
        assert_eq!(m.median(), Some(5.0));
        m.push(1.0);
        assert_eq!(m.median(), Some(3.0));
        m.push(9.0);
        assert_eq!(m.median(), Some(5.0));
        // Window of 3: 5 is evicted, leaving 1, 9, 100.
        m.push(100.0);
        assert_eq!(m.median(), Some(9.0));
        assert_eq!(m.len(), 3);
    }
}
