//! A delivery stream: where the deliveries of a long-lived session go (an SSE or WebSocket
//! connection, a webhook pusher). The engine task pushes deliveries into the stream's
//! queue; the transport takes them, writes them, and says how it went.
//!
//! The contract with the transport (docs/DESIGN.md §7, upstream #5282):
//! - [`Stream::written`] after a batch reached the socket: the credit it used comes back
//!   (the deliveries stay in flight until ACKed or their ACK timeout);
//! - [`Stream::failed`] for deliveries whose write failed: handed back at once (NACK);
//! - dropping the stream ends the session: what is still queued (never written) is handed
//!   back at once.
//!
//! The queue never holds more than the session's window: the engine gives the core credit
//! for the room left in it, nothing more.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use madsim_tokio as tokio;
use tokio::sync::{mpsc, Notify};
use unimesh_core::{ClientId, Delivery, DeliveryId, GroupName};

/// Identifies one session: a reconnect of the same client is a new session, so notices of
/// the old one cannot touch it.
pub(crate) type SessionId = u64;

/// What the transport tells the engine task.
#[derive(Debug)]
pub(crate) enum Notice {
    /// The session ended (the transport dropped its stream).
    Closed { key: SessionKey, session: SessionId },
    /// These deliveries could not be written.
    Failed {
        key: SessionKey,
        ids: Vec<DeliveryId>,
    },
    /// A webhook answer: settle these deliveries (ACK, or NACK with a delay).
    Settled {
        key: SessionKey,
        session: SessionId,
        ids: Vec<DeliveryId>,
        outcome: PushOutcome,
    },
    /// Deliveries reached the transport's socket; the credit they used comes back.
    Written { key: SessionKey, session: SessionId },
}

/// How a pushed delivery ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PushOutcome {
    /// 2xx.
    Ack,
    /// Anything else, a timeout or a refused connection: NACK with this delay (`None`: the
    /// group's backoff).
    Nack { delay_ms: Option<u64> },
}

/// Whose session: one client of one group.
pub(crate) type SessionKey = (GroupName, ClientId);

/// The part shared by the engine task (pushing) and the transport (taking).
#[derive(Debug, Default)]
pub(crate) struct Queue {
    items: Mutex<VecDeque<Delivery>>,
    ready: Notify,
    /// The engine ended the session (replaced by a reconnect, group deleted, shutdown).
    ended: AtomicBool,
    /// Deliveries the transport took and has not reported on yet (being written, or
    /// waiting for a webhook's answer): they use credit too.
    busy: AtomicUsize,
}

impl Queue {
    pub(crate) fn push(&self, d: Delivery) {
        self.lock().push_back(d);
        self.ready.notify_one();
    }

    /// Deliveries using the session's window: queued, or taken and not reported on.
    pub(crate) fn used(&self) -> usize {
        self.lock().len() + self.busy.load(Ordering::Acquire)
    }

    /// Takes everything queued (the session ended: it goes back to the core).
    pub(crate) fn drain(&self) -> Vec<Delivery> {
        self.lock().drain(..).collect()
    }

    /// Ends the session from the engine's side: the transport sees the end once it has
    /// taken what is queued.
    pub(crate) fn end(&self) {
        self.ended.store(true, Ordering::Release);
        self.ready.notify_one();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Delivery>> {
        // The lock guards a plain queue; a panic while it was held cannot leave it broken.
        self.items.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The transport's end of a session.
pub struct Stream {
    pub(crate) key: SessionKey,
    pub(crate) session: SessionId,
    pub(crate) queue: Arc<Queue>,
    pub(crate) notices: mpsc::UnboundedSender<Notice>,
}

impl Stream {
    pub fn group(&self) -> &GroupName {
        &self.key.0
    }

    pub fn client(&self) -> &ClientId {
        &self.key.1
    }

    /// Waits for deliveries and takes up to `max` of them; `None` once the engine ended the
    /// session and nothing is left.
    pub async fn next(&self, max: usize) -> Option<Vec<Delivery>> {
        loop {
            {
                let mut q = self.queue.lock();
                if !q.is_empty() {
                    let n = q.len().min(max.max(1));
                    self.queue.busy.fetch_add(n, Ordering::AcqRel);
                    return Some(q.drain(..n).collect());
                }
            }
            if self.queue.ended.load(Ordering::Acquire) {
                return None;
            }
            // `notify_one` keeps a permit when nobody waits, so a push between the check
            // above and this wait is not missed.
            self.queue.ready.notified().await;
        }
    }

    /// `n` of the deliveries taken reached the socket.
    pub fn written(&self, n: usize) {
        self.done(n);
        let _ = self.notices.send(Notice::Written {
            key: self.key.clone(),
            session: self.session,
        });
    }

    /// These deliveries could not be written: hand them back at once.
    pub fn failed(&self, ids: Vec<DeliveryId>) {
        if ids.is_empty() {
            return;
        }
        self.done(ids.len());
        let _ = self.notices.send(Notice::Failed {
            key: self.key.clone(),
            ids,
        });
    }

    /// A webhook's answer for these deliveries.
    pub fn settled(&self, ids: Vec<DeliveryId>, outcome: PushOutcome) {
        self.done(ids.len());
        let _ = self.notices.send(Notice::Settled {
            key: self.key.clone(),
            session: self.session,
            ids,
            outcome,
        });
    }
}

impl Stream {
    fn done(&self, n: usize) {
        let _ = self
            .queue
            .busy
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
                Some(b.saturating_sub(n))
            });
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _ = self.notices.send(Notice::Closed {
            key: self.key.clone(),
            session: self.session,
        });
    }
}
