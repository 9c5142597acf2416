//! The engine's tap: an observer told, in order and with the mesh's own time, everything
//! the engine task hands the core and everything it carries out. `serve` runs without one;
//! the madsim harness (`sim/madsim`) feeds the contract checker from it, since only the
//! task knows the order of inputs and effects, the mesh's clock in milliseconds, and the
//! deliveries no client ever received.
//!
//! Contract for implementors: every call is made from the engine task while it holds the
//! mesh, so a call must not block and must not call back into the engine. The calls come in
//! the order things happened:
//! - [`EngineTap::started`] once, after the mesh was built and before its first effect;
//! - [`EngineTap::input`] after the mesh answered an input and before any effect of it is
//!   carried out. The engine fires due timers with a `Tick` of their own before every other
//!   input, so an input's effects are its own (a flush a timer triggers is not mixed with a
//!   seek's effects, nor a redelivery with a poll's);
//! - [`EngineTap::effect`] for every effect but `Persist`, right before it is carried out,
//!   and [`EngineTap::persist`] for every `Persist`, with the very `Arc` the persist writer
//!   hands to [`super::StatePort::apply`] (so a store can tell which ticket it is applying).

use std::sync::Arc;

use unimesh_core::{Effect, Epoch, Input, Millis, PersistBatch, Response, Ticket};

/// An observer of the engine task (see the module documentation).
pub trait EngineTap: Send + Sync + 'static {
    /// The mesh of `epoch` was built at `now_ms` (the mesh's time; 0 at every start).
    fn started(&self, now_ms: Millis, epoch: Epoch);

    /// The mesh answered `input` with `response` at `now_ms`.
    fn input(&self, now_ms: Millis, input: &Input, response: &Response);

    /// The engine is about to carry out `effect` (never a `Persist`).
    fn effect(&self, now_ms: Millis, effect: &Effect);

    /// The engine queues `batch` for the persist writer under `ticket`.
    fn persist(&self, now_ms: Millis, ticket: Ticket, batch: &Arc<PersistBatch>);
}
