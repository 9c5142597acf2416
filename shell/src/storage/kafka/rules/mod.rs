//! The group consumer's decisions, with no rdkafka and no tokio in them (the quinn-proto
//! split): the I/O sides only forward what the group coordinator says and carry out what
//! these answer. `io/consumer.rs` is the librdkafka side; under madsim `io/simulated.rs` takes
//! its place against the harness's group coordinator and madsim-rdkafka's broker, and runs
//! the same decisions, so the simulation checks the code that ships.
//!
//! - [`Rebalance`]: what the coordinator says, as librdkafka's rebalance callback says it
//!   (and as the simulated coordinator sends it): partitions assigned in a generation,
//!   partitions revoked (lost or not).
//! - `assign`: what an assignment resumes each partition from — the progress record or the
//!   committed offset — and what the lane checks against the log before it reads on.
//! - `revoke`: what a revocation asks the engine, commits and lets go, lost or not.
//! - `fence`: which of a lane's progress records a reader takes (the generation fence).
//! - `part`: the partition buffer and its rule (offset gaps, repositions, pausing).
//!
//! - `epochs`: the leader-epoch rules (divergence, a claimed end against what a lane knows,
//!   reads that look back), used by the librdkafka side's probe (`io/probe.rs`) and by the
//!   simulated consumer's divergence check (the simulated broker has no leader epochs and
//!   never loses a tail).

pub mod assign;
pub mod epochs;
pub mod fence;
pub mod part;
pub mod revoke;

use unimesh_core::Partition;

/// A rebalance as the group consumer hears of it: librdkafka's rebalance callback (an
/// `ASSIGN_PARTITIONS` or `REVOKE_PARTITIONS` error code with a partition list, the group
/// generation and `assignment_lost()`), or the simulated coordinator's message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rebalance {
    /// These partitions are now this member's, given in group generation `generation`
    /// (`None`: the client reports none; its progress writes are then not fenced). With
    /// the cooperative protocol the list holds only what is added, and may be empty.
    Assign {
        partitions: Vec<Partition>,
        generation: Option<i32>,
    },
    /// These partitions are taken from this member. `lost`: the coordinator already gave
    /// them to another member (this member's session expired without it knowing).
    Revoke {
        partitions: Vec<Partition>,
        lost: bool,
    },
}
