//! Models of the world around the mesh: a partitioned broker, a durable store with a
//! `Persisted` barrier, a group coordinator, and clients. Each is deterministic given its
//! inputs; faults are applied by the harness (see `crate::faults`) so a madsim harness can
//! reuse them.

pub mod broker;
pub mod client;
pub mod coordinator;
pub mod store;
