//! unimesh-sim-shell: the shell's real engine under the madsim simulator.
//!
//! The core's simulation (`unimesh-sim`) proves the state machine; this crate proves the
//! shell's mapping of its effects onto I/O — the engine task, the persist writer and its
//! ticket order, the long-poll credit and the hand-back of deliveries nobody received, the
//! publish path, recovery at start — under node kills, broker and store faults and
//! misbehaving clients, from one seed, deterministically.
//!
//! One seed is one run ([`run_seed`]): a madsim runtime seeded with it; a mesh node whose
//! start-up is `engine::start_observed` (what `serve` calls, plus a tap) on simulated
//! storage whose writes count once durable and which outlives the node (`storage`); a node
//! of model clients calling the engine through a front door that stands in for the HTTP
//! server (`clients`, `node`), and webhook targets for the shipped pushers (`webhook`); kills, restarts, clock jumps and operators (`operators`).
//! The contract checker of `unimesh-sim` (C1–C9) is fed from the engine's tap, the storage
//! and the front (`world`), with the harness's own checks of what clients got
//! (`tracker`). After the fault phase, faults stop and the run must converge.
//!
//! Everything is built only with `RUSTFLAGS="--cfg madsim"` (a target directory of its
//! own); a plain build of the workspace builds this crate empty.
//!
//! - `cargo test -p unimesh-sim-shell` (with the flag): a few hundred seeds, a replay, the
//!   determinism check (see `tests/seeds.rs` for the variables it reads);
//! - `cargo run -p unimesh-sim-shell --release -- --seeds N [--from S]`: a long sweep that
//!   prints seeds/s and the faults injected;
//! - `MADSIM_TEST_SEED=<n>` replays one seed exactly (same trace hash).
//!
//! Determinism rests on madsim's generator alone: each seed runs on a thread of its own
//! (std's `HashMap` keys), and every `tokio::select!` the harness runs is `biased` (an
//! unbiased one draws its order from tokio's own thread-local generator, seeded with a
//! process-wide counter: the second run of a seed in a process would poll in another
//! order). `tests/select.rs` checks the sources for it.

#![cfg(madsim)]
#![forbid(unsafe_code)]

pub mod clients;
pub mod counts;
pub mod node;
pub mod operators;
pub mod options;
pub mod run;
pub mod storage;
pub mod sweep;
pub mod tracker;
pub mod webhook;
pub mod world;

pub use counts::Counts;
pub use options::Options;
pub use run::{
    check_determinism, check_determinism_groups, check_determinism_kafka, kafka_backend,
    memory_backend, run_seed, run_seed_on, run_shape, Failure, MakeBackend, Report, Shape, GROUPS,
};
