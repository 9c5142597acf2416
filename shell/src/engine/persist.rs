//! The persist writer: applies the core's batches to the state store one at a time, in
//! ticket order, and reports each outcome back to the engine task.

use std::sync::Arc;

use madsim_tokio as tokio;
use tokio::sync::mpsc;
use unimesh_core::{PersistBatch, Ticket};

use super::command::Event;
use super::ports::StatePort;

/// Writes persists one at a time, in the order the core issued them.
pub(crate) async fn persist_writer(
    state: Arc<dyn StatePort>,
    mut batches: mpsc::Receiver<(Ticket, Arc<PersistBatch>)>,
    events: mpsc::Sender<Event>,
) {
    while let Some((ticket, batch)) = batches.recv().await {
        let result = state.apply(batch, wall_ms()).await;
        if events
            .send(Event::Persisted { ticket, result })
            .await
            .is_err()
        {
            break;
        }
    }
}

pub(crate) fn wall_ms() -> u64 {
    crate::log::WallClock::now_ms(&crate::log::SystemClock)
}
