//! unimesh-sim: deterministic simulation of the delivery contract.
//!
//! One seed drives one run ([`harness::run_seed`]): the pure core against a model broker,
//! store and clients ([`model`]), with faults drawn from the seed ([`options`], [`faults`])
//! and the contract of DESIGN.md §3 checked at every step and at quiescence ([`checker`]).
//! The checker and the fault models know nothing of the harness, so a harness of the real
//! shell (madsim) can reuse them.
//!
//! # Layout
//! - [`checker`]: the contract checker, one file per clause family — `state` (its mirror
//!   of the world), `world` (groups, the broker's log, retention; C9), `generations`
//!   (incarnations, assignment, revocation, seeks; C4), `delivery` (C1, C2, C4, C5, C7,
//!   C8), `settle` (ACK/NACK/extend answers; C4), `persist` (C1, C3, C4, C5), `broker`
//!   (commits, POP broker ACKs, skips; C3, C6, C1), `quiescence` (liveness; C1, C2, C6).
//!   Its module documentation says what each hook expects to be told and when.
//! - [`harness`]: the discrete-event run of the core — `Sim` and its run loop in `mod.rs`,
//!   `queue` (events in time order), `events` (one handler per kind), `mesh` (inputs,
//!   time, timers), `effects` (draining effects, one function per kind), `broker`
//!   (publishing, fetches), `store`, `clients`, `faults/` (crash and restart, rebalance,
//!   operator seek and replay, retention, clock jumps), `liveness` (the end of faults,
//!   convergence), `report` (what a run reports, its digest).
//! - [`model`]: the broker, store and clients the harness runs the core against.
//! - [`faults`]: fault counts and fetch distortions; [`options`]: the options a seed draws
//!   (swarm testing); [`rng`]: the seeded RNG; [`trace`]: the trace hash and last steps;
//!   [`sweep`]: many seeds on a few threads, and the list of recorded hashes.
//!
//! `cargo run -p unimesh-sim --release -- --seeds N [--from S]` sweeps seeds;
//! `UNIMESH_SEED=<seed>` replays one (see `tests/seeds.rs`);
//! `--check-hashes sim/tests/trace_hashes.txt` holds every seed of the list to the trace
//! hash and digest recorded before the core and the simulation were split (a refactor must
//! change none).

#![forbid(unsafe_code)]

pub mod checker;
pub mod faults;
pub mod harness;
pub mod model;
pub mod options;
pub mod rng;
pub mod sweep;
pub mod trace;

pub use checker::{Checker, Clause, SettleKind, Violation};
pub use harness::{run, run_seed, Failure, RunReport};
pub use options::{Options, Size};
