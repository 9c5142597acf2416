//! Delivery sessions that outlive one request: streams (SSE, WebSocket) and webhook
//! pushers. With the long-polls of `polls`, these are every place a client's deliveries can
//! go; `EngineTask::deliver` hands each delivery to the one session of its (group, client).
//!
//! One credit and one failure rule for all of them:
//! - credit: the core may hand a session as many deliveries as its queue has room for (its
//!   window); the room comes back when the transport says it wrote them (`Written`), and
//!   the group's `maxInFlightPerClient` bounds what stays unACKed;
//! - a failed write hands the delivery back at once (`Failed`: NACK, no ACK-timeout wait);
//! - a session that ends hands back at once what was queued and not written; what was
//!   written stays in flight until ACKed or its ACK timeout;
//! - a client that opens a session again after a drop gets everything it had not ACKed
//!   again at once (the core's `ClientGone`: a redelivery, counted as such).

use std::collections::BTreeMap;
use std::sync::Arc;

use unimesh_core::{ClientId, GroupName, Input, Response};

use super::EngineTask;
use crate::engine::api::refusal;
use crate::engine::command::Reply;
use crate::engine::stream::{Notice, PushOutcome, Queue, SessionId, SessionKey, Stream};

/// One open stream session.
pub(super) struct StreamSession {
    id: SessionId,
    queue: Arc<Queue>,
    /// Most deliveries queued for it at once.
    window: u32,
}

/// The open stream sessions. Invariant: at most one per key; a session's queue is ended
/// exactly when it leaves this map.
#[derive(Default)]
pub(super) struct Streams {
    sessions: BTreeMap<SessionKey, StreamSession>,
    next_id: SessionId,
}

impl Streams {
    fn open(&mut self, key: SessionKey, window: u32) -> (SessionId, Arc<Queue>) {
        debug_assert!(!self.sessions.contains_key(&key), "one session per client");
        self.next_id += 1;
        let queue = Arc::new(Queue::default());
        self.sessions.insert(
            key,
            StreamSession {
                id: self.next_id,
                queue: queue.clone(),
                window: window.max(1),
            },
        );
        (self.next_id, queue)
    }

    /// Removes a session and ends its queue.
    fn take(&mut self, key: &SessionKey) -> Option<StreamSession> {
        let s = self.sessions.remove(key)?;
        s.queue.end();
        Some(s)
    }

    fn is_current(&self, key: &SessionKey, id: SessionId) -> bool {
        self.sessions.get(key).is_some_and(|s| s.id == id)
    }

    /// Queues a delivery for the session of `key`; gives it back when there is none.
    pub fn push(
        &mut self,
        key: &SessionKey,
        d: unimesh_core::Delivery,
    ) -> Option<unimesh_core::Delivery> {
        match self.sessions.get(key) {
            Some(s) => {
                s.queue.push(d);
                None
            }
            None => Some(d),
        }
    }

    pub fn contains(&self, key: &SessionKey) -> bool {
        self.sessions.contains_key(key)
    }

    /// Every session's key, optionally of one group only.
    pub fn keys(&self, group: Option<&GroupName>) -> Vec<SessionKey> {
        self.sessions
            .keys()
            .filter(|(g, _)| group.is_none_or(|want| g == want))
            .cloned()
            .collect()
    }
}

impl EngineTask {
    /// Opens a stream session for one client: a long-poll or stream it had ends first, and
    /// whatever it still holds from before is handed back at once, so it comes again on
    /// this session (the client reconnected: it cannot ACK what it never finished).
    pub(super) fn open_stream(
        &mut self,
        group: GroupName,
        client: ClientId,
        window: u32,
        reply: Reply<Stream>,
    ) {
        let key = (group.clone(), client.clone());
        self.finish_waiter(&key);
        self.end_stream(&key);
        let known = self
            .mesh
            .group_view(&group)
            .is_some_and(|v| v.clients.iter().any(|c| c.id == client));
        if known {
            let _ = self.handle(Input::ClientGone {
                group: group.clone(),
                client: client.clone(),
            });
        }
        let (session, queue) = self.streams.open(key.clone(), window);
        match self.handle(Input::ClientPoll {
            group: group.clone(),
            client,
            max: window.max(1),
        }) {
            Response::Refused(r) => {
                self.streams.take(&key);
                let _ = reply.send(Err(refusal(r, &group)));
            }
            _ => {
                let stream = Stream {
                    key,
                    session,
                    queue,
                    notices: self.notices_tx.clone(),
                };
                // A requester that went away drops the stream with the reply, which ends
                // the session through its `Closed` notice.
                let _ = reply.send(Ok(stream));
            }
        }
        self.finish_pending();
    }

    /// Ends a stream session from the engine's side: its credit is withdrawn and what was
    /// queued and not written goes back to the core at once.
    pub(super) fn end_stream(&mut self, key: &SessionKey) {
        let Some(s) = self.streams.take(key) else {
            return;
        };
        let _ = self.handle(Input::ClientPoll {
            group: key.0.clone(),
            client: key.1.clone(),
            max: 0,
        });
        let unwritten = s.queue.drain();
        if !unwritten.is_empty() {
            let ids = unwritten.iter().map(|d| d.id).collect();
            let _ = self.handle(Input::Nack {
                group: key.0.clone(),
                ids,
                delay_ms: Some(0),
            });
        }
    }

    /// What a transport reported.
    pub(super) fn on_notice(&mut self, notice: Notice) {
        match notice {
            Notice::Closed { key, session } => {
                if self.streams.is_current(&key, session) {
                    self.end_stream(&key);
                }
            }
            Notice::Failed { key, ids, .. } => {
                // Handed back whether or not the session is still the current one: the
                // core answers ids it no longer holds as stale or done, harmlessly.
                let _ = self.handle(Input::Nack {
                    group: key.0,
                    ids,
                    delay_ms: Some(0),
                });
            }
            Notice::Settled {
                key,
                session,
                ids,
                outcome,
            } => {
                let input = match outcome {
                    PushOutcome::Ack => Input::Ack {
                        group: key.0.clone(),
                        ids,
                    },
                    PushOutcome::Nack { delay_ms } => Input::Nack {
                        group: key.0.clone(),
                        ids,
                        delay_ms,
                    },
                };
                let _ = self.handle(input);
                self.refill(&key, session);
            }
            Notice::Written { key, session } => self.refill(&key, session),
        }
        self.finish_pending();
    }

    /// Gives a session the credit of the room left in its queue.
    fn refill(&mut self, key: &SessionKey, session: SessionId) {
        let Some(s) = self.streams.sessions.get(key) else {
            return;
        };
        if s.id != session {
            return;
        }
        let room = (s.window as usize).saturating_sub(s.queue.used());
        let max = u32::try_from(room).unwrap_or(s.window);
        let _ = self.handle(Input::ClientPoll {
            group: key.0.clone(),
            client: key.1.clone(),
            max,
        });
    }
}
