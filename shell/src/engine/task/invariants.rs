//! Debug builds check the core's invariants while they serve: a violation is a bug worth
//! stopping for. The check is O(state), so after every input it made a debug server with
//! a large state too slow to answer: schemathesis' fuzzing once left about 1 800 records of
//! a webhook group in backoff (a target that refuses connections, a zero backoff), and
//! the server spent minutes of CPU checking between its redeliveries while requests timed
//! out. So the shell checks at most about a tenth of the time: after an input, when the
//! time since the last check is at least nine times what that check took. At test sizes a
//! check takes microseconds and still runs after nearly every input; under madsim a check
//! takes no simulated time and runs after every one (deterministic). The core simulation
//! and the core's own tests check after every step (`Mesh::check_every_step`).

use madsim_tokio as tokio;
use tokio::time::Instant;
use unimesh_core::Mesh;

/// How much longer than a check takes the engine goes without one.
const UNCHECKED_PER_CHECKED: u32 = 9;

/// When the next invariant check is due (debug builds only).
#[derive(Debug, Default)]
pub(crate) struct InvariantSampler {
    next: Option<Instant>,
}

impl InvariantSampler {
    /// After an input: checks the core's invariants when due; panics on a violation.
    pub fn after_input(&mut self, mesh: &Mesh) {
        if !cfg!(debug_assertions) {
            return;
        }
        let started = Instant::now();
        if self.next.is_some_and(|t| started < t) {
            return;
        }
        if let Err(violation) = mesh.check_invariants() {
            panic!("unimesh-core invariant violated: {violation}");
        }
        let spent = started.elapsed();
        self.next = Some(Instant::now() + spent * UNCHECKED_PER_CHECKED);
    }
}
