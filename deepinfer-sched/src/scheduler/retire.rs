//! Taking the requests that finished during an `update` out of the running
//! list. A few finish per step out of a thousand running, so they are found
//! from a hint (the row's index in its step, which is the request's place in
//! the running list when no running request before it was skipped by the
//! plan) and the list is closed up behind the first one with block moves,
//! instead of a filter over every entry.

/// How far past its hint a finished slot is looked for before the whole list
/// is searched (running requests the plan skipped or gave a prefill chunk
/// move a decode row's index below its place in the list).
const NEAR: usize = 64;

/// Removes the `finished` running slots (each with its position hint, or
/// `u32::MAX` for none) from `running`, keeping the others in order.
/// `scratch` holds their positions meanwhile.
pub(super) fn remove_finished(
    running: &mut Vec<u32>,
    finished: &[(u32, u32)],
    scratch: &mut Vec<usize>,
) {
    scratch.clear();
    for &(slot, hint) in finished {
        let h = hint as usize;
        let near = || {
            let tail = running.get(h..)?;
            let p = tail.iter().take(NEAR).position(|&s| s == slot)?;
            Some(h + p)
        };
        let found = if running.get(h) == Some(&slot) {
            Some(h)
        } else {
            near().or_else(|| running.iter().position(|&s| s == slot))
        };
        // (A finished running slot is always in the list; nothing to remove otherwise.)
        debug_assert!(found.is_some(), "finished slot {slot} not running");
        scratch.extend(found);
    }
    scratch.sort_unstable();
    scratch.dedup();
    let Some(&first) = scratch.first() else {
        return;
    };
    // Move each stretch between two removed positions down over the gap.
    let mut write = first;
    for (k, &p) in scratch.iter().enumerate() {
        let end = scratch.get(k + 1).copied().unwrap_or(running.len());
        running.copy_within(p + 1..end, write);
        write += end - p - 1;
    }
    running.truncate(write);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(running: &[u32], finished: &[(u32, u32)]) {
        let mut v = running.to_vec();
        remove_finished(&mut v, finished, &mut Vec::new());
        let gone: Vec<u32> = finished.iter().map(|f| f.0).collect();
        let want: Vec<u32> = running
            .iter()
            .copied()
            .filter(|s| !gone.contains(s))
            .collect();
        assert_eq!(v, want, "running {running:?} finished {finished:?}");
    }

    #[test]
    fn exact_stale_and_missing_hints() {
        let running: Vec<u32> = (0..200).rev().collect();
        // Exact hints.
        check(&running, &[(199, 0), (0, 199), (100, 99)]);
        // Hints a little low (found near), far off, past the end, none.
        check(&running, &[(150, 40), (10, 0), (20, 5000), (30, u32::MAX)]);
        // Unsorted, adjacent, duplicated.
        check(&running, &[(5, 194), (6, 193), (7, 192), (6, 193)]);
        check(&running, &[]);
        check(&[3], &[(3, 0)]);
    }

    #[test]
    fn every_subset_of_a_short_list() {
        let running = [4u32, 9, 1, 7, 0];
        for mask in 0u32..32 {
            let finished: Vec<(u32, u32)> = (0..5)
                .filter(|i| mask & (1 << i) != 0)
                .map(|i| (running[i], (i as u32 + mask) % 7))
                .collect();
            check(&running, &finished);
        }
    }
}
