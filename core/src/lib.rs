//! unimesh-core: the dispatcher, offset tracking and restart alignment of unimesh as a pure
//! state machine. Inputs in, effects out, `now` passed in; no I/O, no clock, no randomness,
//! no threads. The shell maps effects onto the real world; the simulation drives the same
//! code against model brokers, clients and stores.
//!
//! Start at [`Mesh`]: `handle(now_ms, Input)`, `poll_effect()`, `poll_timeout()`.

#![forbid(unsafe_code)]

pub mod checkpoint;
pub mod config;
pub mod delivery_id;
pub mod filter;
mod group;
pub mod io;
mod lane;
pub mod mesh;
pub mod progress;
pub mod ratelimit;
pub mod record;
mod slots;
pub mod types;

pub use checkpoint::{Checkpoint, CheckpointError};
pub use config::{Backoff, MeshConfig, Ordering, StartFrom, SubscriptionLimits, SubscriptionSpec};
pub use delivery_id::{DeliveryId, DeliveryIdError};
pub use filter::Filter;
pub use group::GroupStats;
pub use io::{
    Assignment, DeadLetter, DeadLetterReason, Delivery, DlqKey, Effect, FetchId, FetchResult,
    Input, LaneCheckpoint, PersistBatch, Recovered, Refusal, RejectReason, Response, Settle,
    SkipReason, Ticket, REPLAY_PARTITION,
};
pub use mesh::{ClientView, GroupView, LaneView, Mesh, MeshStats, RecoveryError, TimeoutReason};
pub use progress::Progress;
pub use ratelimit::{RateLimiter, RateRule};
pub use record::{EventMeta, Record, RecordMeta};
pub use types::{ClientId, Epoch, GroupName, Millis, NameError, Offset, Partition, TopicName};
