//! unimesh-sim: deterministic simulation of the delivery contract.
//!
//! One seed drives one run ([`harness::run_seed`]): the pure core against a model broker,
//! store and clients ([`model`]), with faults drawn from the seed ([`options`], [`faults`])
//! and the contract of DESIGN.md §3 checked at every step and at quiescence ([`checker`]).
//! The checker and the fault models know nothing of the harness, so a harness of the real
//! shell (madsim) can reuse them.
//!
//! `cargo run -p unimesh-sim --release -- --seeds N [--from S]` sweeps seeds;
//! `UNIMESH_SEED=<seed>` replays one (see `tests/seeds.rs`).

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
