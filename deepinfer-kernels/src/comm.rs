//! Collectives between the ranks of an expert-parallel group: all-to-all exchange of rows,
//! dispatch of token rows to the ranks that hold their experts and the combine back, all-gather,
//! barrier.
//!
//! [`Communicator`] is the interface an expert-parallel forward is written against.
//! [`LocalGroup`] implements it in process, one rank per thread, for tests and CPU multi-rank
//! runs. Everything is in a fixed order: a rank receives its peers' rows in rank order, each
//! rank's rows in the order it sent them, and [`combine`] puts every row back where
//! [`dispatch`] took it from, so results never depend on timing.
//!
//! A rank that leaves (its handle is dropped, for instance by a panicking thread) makes every
//! collective of the others fail with [`CommError::PeerLeft`] instead of waiting forever.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// Why a collective failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommError {
    /// Arguments that do not fit the group (send lists, row widths).
    #[error("{0}")]
    Shape(String),
    /// Another rank left the group; the collective cannot complete.
    #[error("rank {0} left the group")]
    PeerLeft(usize),
    /// The peers did not arrive within the group's timeout.
    #[error("collective timed out after {0:?} waiting for the other ranks")]
    Timeout(Duration),
}

/// One rank's end of a group of `world` ranks exchanging f32 rows.
pub trait Communicator: Send {
    /// This rank, `0..world`.
    fn rank(&self) -> usize;
    /// Ranks in the group.
    fn world(&self) -> usize;
    /// Sends `send[r]` to rank `r` (one list per rank, this one included) and returns what
    /// every rank sent to this one, in rank order. Every rank must call it.
    fn all_to_all(&mut self, send: Vec<Vec<f32>>) -> Result<Vec<Vec<f32>>, CommError>;
    /// Every rank's `local`, in rank order.
    fn all_gather(&mut self, local: Vec<f32>) -> Result<Vec<Vec<f32>>, CommError> {
        let send = vec![local; self.world()];
        self.all_to_all(send)
    }
    /// Returns once every rank has called it.
    fn barrier(&mut self) -> Result<(), CommError> {
        self.all_to_all(vec![Vec::new(); self.world()]).map(|_| ())
    }
}

/// Where [`dispatch`] sent each row, for [`combine`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DispatchPlan {
    /// Per row of the input: the destination rank.
    dest: Vec<usize>,
    /// Rows received from each rank (the received rows are grouped by source rank).
    received: Vec<usize>,
}

impl DispatchPlan {
    /// Rows this rank received, per source rank.
    pub fn received_per_rank(&self) -> &[usize] {
        &self.received
    }
}

/// Sends each row of `rows` (`width` floats each) to rank `dest[i]`; returns the rows this
/// rank received (grouped by source rank, each group in its sender's order) and the plan
/// [`combine`] needs to send results back. Every rank must call it.
pub fn dispatch(
    comm: &mut dyn Communicator,
    rows: &[f32],
    width: usize,
    dest: &[usize],
) -> Result<(Vec<f32>, DispatchPlan), CommError> {
    let world = comm.world();
    if width == 0 || rows.len() != dest.len() * width {
        return Err(CommError::Shape(format!(
            "{} values are not {} rows of width {width}",
            rows.len(),
            dest.len()
        )));
    }
    if let Some(&bad) = dest.iter().find(|&&d| d >= world) {
        return Err(CommError::Shape(format!(
            "destination rank {bad} outside a group of {world}"
        )));
    }
    let mut send = vec![Vec::new(); world];
    for (row, &d) in rows.chunks_exact(width).zip(dest) {
        send[d].extend_from_slice(row);
    }
    let got = comm.all_to_all(send)?;
    let received: Vec<usize> = got.iter().map(|g| g.len() / width).collect();
    if let Some((r, g)) = got.iter().enumerate().find(|(_, g)| g.len() % width != 0) {
        return Err(CommError::Shape(format!(
            "rank {r} sent {} values, not rows of width {width}",
            g.len()
        )));
    }
    Ok((
        got.concat(),
        DispatchPlan {
            dest: dest.to_vec(),
            received,
        },
    ))
}

/// Sends `results` (one row of `width` floats per received row, in the received order) back
/// to their source ranks and returns this rank's rows in the order they were dispatched.
/// Every rank must call it.
pub fn combine(
    comm: &mut dyn Communicator,
    results: &[f32],
    width: usize,
    plan: &DispatchPlan,
) -> Result<Vec<f32>, CommError> {
    let w = width;
    if w == 0 {
        return Err(CommError::Shape("results of width 0".into()));
    }
    let total: usize = plan.received.iter().sum();
    if results.len() != total * w {
        return Err(CommError::Shape(format!(
            "{} result values for {total} received rows of width {w}",
            results.len()
        )));
    }
    let mut send = Vec::with_capacity(plan.received.len());
    let mut at = 0;
    for &n in &plan.received {
        send.push(results[at * w..(at + n) * w].to_vec());
        at += n;
    }
    let back = comm.all_to_all(send)?;
    // Rows sent to rank r come back in the order they were sent: walk `dest` in order.
    let mut next = vec![0usize; back.len()];
    let mut out = Vec::with_capacity(plan.dest.len() * w);
    for &d in &plan.dest {
        let i = next[d];
        let row = back[d].get(i * w..(i + 1) * w).ok_or_else(|| {
            CommError::Shape(format!("rank {d} returned fewer rows than it was sent"))
        })?;
        out.extend_from_slice(row);
        next[d] += 1;
    }
    Ok(out)
}

struct State {
    /// `mail[to][from]`: what `from` sent to `to` in the current round.
    mail: Vec<Vec<Option<Vec<f32>>>>,
    /// Ranks that have posted in the current round.
    posted: usize,
    /// Ranks that have collected in the current round.
    collected: usize,
    round: u64,
    /// A rank that left, and how many rounds it had completed: the rounds from there on
    /// cannot complete.
    left: Option<(usize, u64)>,
}

struct Shared {
    world: usize,
    state: Mutex<State>,
    cv: Condvar,
    timeout: Duration,
}

/// An in-process group: one [`LocalComm`] per rank, each used from its own thread.
pub struct LocalGroup;

impl LocalGroup {
    /// The `world` ranks of a new group; a collective fails with [`CommError::Timeout`] when
    /// its peers do not arrive within `timeout`.
    pub fn ranks(world: usize, timeout: Duration) -> Vec<LocalComm> {
        let shared = Arc::new(Shared {
            world,
            state: Mutex::new(State {
                mail: vec![vec![None; world]; world],
                posted: 0,
                collected: 0,
                round: 0,
                left: None,
            }),
            cv: Condvar::new(),
            timeout,
        });
        (0..world)
            .map(|rank| LocalComm {
                rank,
                shared: shared.clone(),
                rounds: 0,
            })
            .collect()
    }
}

/// One rank of a [`LocalGroup`].
pub struct LocalComm {
    rank: usize,
    shared: Arc<Shared>,
    /// Collectives this rank has completed.
    rounds: u64,
}

impl LocalComm {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits on the condition variable until `done` holds, a peer leaves or time runs out.
    fn wait<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        done: impl Fn(&State) -> bool,
    ) -> Result<MutexGuard<'a, State>, CommError> {
        let deadline = std::time::Instant::now() + self.shared.timeout;
        loop {
            if let Some((r, completed)) = st.left
                && completed <= self.rounds
            {
                return Err(CommError::PeerLeft(r));
            }
            if done(&st) {
                return Ok(st);
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return Err(CommError::Timeout(self.shared.timeout));
            }
            st = self
                .shared
                .cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

impl Communicator for LocalComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.shared.world
    }

    fn all_to_all(&mut self, send: Vec<Vec<f32>>) -> Result<Vec<Vec<f32>>, CommError> {
        let world = self.shared.world;
        if send.len() != world {
            return Err(CommError::Shape(format!(
                "{} send lists for a group of {world}",
                send.len()
            )));
        }
        let me = self.rank;
        let mut st = self.lock();
        // A round's mail is posted only after every rank collected the previous round's.
        let round = st.round;
        st = self.wait(st, |s| {
            s.round == round && s.collected == 0 || s.round > round
        })?;
        let round = st.round;
        for (to, rows) in send.into_iter().enumerate() {
            st.mail[to][me] = Some(rows);
        }
        st.posted += 1;
        self.shared.cv.notify_all();
        st = self.wait(st, |s| s.round == round && s.posted == world)?;
        let got: Vec<Vec<f32>> = st.mail[me]
            .iter_mut()
            .map(|m| m.take().unwrap_or_default())
            .collect();
        st.collected += 1;
        if st.collected == world {
            st.posted = 0;
            st.collected = 0;
            st.round += 1;
        }
        self.shared.cv.notify_all();
        drop(st);
        self.rounds += 1;
        Ok(got)
    }
}

impl Drop for LocalComm {
    fn drop(&mut self) {
        let rounds = self.rounds;
        let mut st = self.lock();
        st.left.get_or_insert((self.rank, rounds));
        self.shared.cv.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const T: Duration = Duration::from_secs(10);

    /// Runs `f` on every rank of a new group, one thread each; results in rank order.
    fn on_ranks<R: Send>(world: usize, f: impl Fn(&mut LocalComm) -> R + Sync) -> Vec<R> {
        let comms = LocalGroup::ranks(world, T);
        std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .into_iter()
                .map(|mut c| {
                    let f = &f;
                    s.spawn(move || f(&mut c))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Every rank gets, from each peer, exactly what that peer sent it, over rounds.
        #[test]
        fn all_to_all_delivers_exactly(world in 1usize..5, sizes in proptest::collection::vec(0usize..6, 25), rounds in 1usize..4) {
            let got = on_ranks(world, |c| {
                let mut out = Vec::new();
                for round in 0..rounds {
                    let send: Vec<Vec<f32>> = (0..world)
                        .map(|to| {
                            let n = sizes[(c.rank() * 5 + to) % sizes.len()];
                            (0..n).map(|i| (round * 1000 + c.rank() * 100 + to * 10 + i) as f32).collect()
                        })
                        .collect();
                    out.push(c.all_to_all(send).unwrap());
                }
                out
            });
            for (me, rounds_got) in got.iter().enumerate() {
                for (round, from_all) in rounds_got.iter().enumerate() {
                    for (from, rows) in from_all.iter().enumerate() {
                        let n = sizes[(from * 5 + me) % sizes.len()];
                        let want: Vec<f32> = (0..n).map(|i| (round * 1000 + from * 100 + me * 10 + i) as f32).collect();
                        prop_assert_eq!(rows, &want);
                    }
                }
            }
        }

        /// Dispatch then combine of a per-row function gives the function applied in place,
        /// whatever the destinations.
        #[test]
        fn dispatch_then_combine_is_the_identity_map(world in 1usize..5, width in 1usize..4, dests in proptest::collection::vec(0usize..4, 0..12)) {
            let out = on_ranks(world, |c| {
                let me = c.rank();
                let dest: Vec<usize> = dests.iter().map(|&d| (d + me) % world).collect();
                let rows: Vec<f32> = (0..dest.len() * width).map(|i| (me * 1000 + i) as f32).collect();
                let (recv, plan) = dispatch(c, &rows, width, &dest).unwrap();
                // The "expert" on each rank: the row's first value plus 0.5, one value per row.
                let res: Vec<f32> = recv.chunks(width).map(|r| r[0] + 0.5).collect();
                let back = combine(c, &res, 1, &plan).unwrap();
                (rows, back)
            });
            for (rows, back) in out {
                let want: Vec<f32> = rows.chunks(width).map(|r| r[0] + 0.5).collect();
                prop_assert_eq!(back, want);
            }
        }
    }

    #[test]
    fn all_gather_and_barrier() {
        let got = on_ranks(3, |c| {
            c.barrier().unwrap();
            c.all_gather(vec![c.rank() as f32; c.rank() + 1]).unwrap()
        });
        for g in got {
            assert_eq!(g, vec![vec![0.0], vec![1.0, 1.0], vec![2.0, 2.0, 2.0]]);
        }
    }

    #[test]
    fn bad_arguments_are_errors() {
        let mut comms = LocalGroup::ranks(1, T);
        let c = &mut comms[0];
        assert!(matches!(c.all_to_all(vec![]), Err(CommError::Shape(_))));
        assert!(matches!(
            dispatch(c, &[1.0, 2.0, 3.0], 2, &[0]),
            Err(CommError::Shape(_))
        ));
        assert!(matches!(
            dispatch(c, &[1.0, 2.0], 2, &[1]),
            Err(CommError::Shape(_))
        ));
        let (_, plan) = dispatch(c, &[1.0, 2.0], 2, &[0]).unwrap();
        assert!(matches!(
            combine(c, &[1.0], 2, &plan),
            Err(CommError::Shape(_))
        ));
    }

    #[test]
    fn a_rank_that_leaves_fails_the_others_instead_of_hanging() {
        let mut comms = LocalGroup::ranks(2, T);
        let gone = comms.pop().unwrap();
        drop(gone);
        let err = comms[0].all_to_all(vec![vec![], vec![]]).unwrap_err();
        assert_eq!(err, CommError::PeerLeft(1));
    }

    #[test]
    fn a_rank_that_never_arrives_times_out() {
        let mut comms = LocalGroup::ranks(2, Duration::from_millis(50));
        let err = comms[0].barrier().unwrap_err();
        assert!(matches!(err, CommError::Timeout(_)), "{err}");
        drop(comms);
    }
}
