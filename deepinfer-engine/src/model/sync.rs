//! The launch-phase guard: a debug check that the host thread does not read device results
//! while a step is in flight.
//!
//! With overlapped scheduling the runtime's host thread prepares step N+1 and post-processes
//! step N−1 while step N computes. Any read of device results on that thread (logits to the
//! host, a drafter call, a tensor download) would wait for the device and serialise the
//! pipeline. With the check on, the runtime marks its host thread as being in the launch
//! phase ([`LaunchPhase::enter`]); every model entry point that returns host data
//! ([`crate::Model::forward`], [`crate::Model::draft`]) calls [`check_host_read`] first and
//! fails with [`ModelError::HostSync`] on a marked thread. The mark is per thread, so the
//! device worker's own reads are unaffected.

use super::ModelError;
use std::cell::Cell;

thread_local! {
    static IN_LAUNCH: Cell<bool> = const { Cell::new(false) };
}

/// Marks the current thread as being in a launch phase until dropped.
#[derive(Debug)]
pub struct LaunchPhase {
    was: bool,
}

impl LaunchPhase {
    /// Enter a launch phase on this thread (nesting is allowed).
    pub fn enter() -> Self {
        LaunchPhase {
            was: IN_LAUNCH.with(|c| c.replace(true)),
        }
    }
}

impl Drop for LaunchPhase {
    fn drop(&mut self) {
        IN_LAUNCH.with(|c| c.set(self.was));
    }
}

/// Whether this thread is inside a launch phase.
pub fn in_launch_phase() -> bool {
    IN_LAUNCH.with(Cell::get)
}

/// Fails with [`ModelError::HostSync`] when called inside a launch phase: `what` names the
/// read (for the error message).
pub fn check_host_read(what: &'static str) -> Result<(), ModelError> {
    if in_launch_phase() {
        Err(ModelError::HostSync(what))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mark_is_scoped_nested_and_per_thread() {
        assert!(check_host_read("x").is_ok());
        {
            let _a = LaunchPhase::enter();
            assert!(matches!(
                check_host_read("x"),
                Err(ModelError::HostSync("x"))
            ));
            {
                let _b = LaunchPhase::enter();
                assert!(in_launch_phase());
            }
            assert!(in_launch_phase());
            std::thread::scope(|s| {
                s.spawn(|| assert!(check_host_read("worker").is_ok()));
            });
        }
        assert!(!in_launch_phase());
    }
}
