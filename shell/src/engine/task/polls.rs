//! Long-polls waiting for deliveries. `Polls` owns the waiters and keeps their two indexes
//! (by deadline, by poll id) exact; the task's methods here turn a poll's end into what the
//! core must hear: its credit withdrawn, and deliveries nobody received handed back.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use madsim_tokio as tokio;
use tokio::time::Instant;
use unimesh_core::{ClientId, Delivery, GroupName, Input, Response};

use super::EngineTask;
use crate::engine::api::refusal;
use crate::engine::command::Reply;

/// Who a poll is for: one client of one group (a client has at most one open poll).
pub(super) type PollKey = (GroupName, ClientId);

/// A long-poll waiting for deliveries.
pub(super) struct Waiter {
    id: u64,
    pub got: Vec<Delivery>,
    pub reply: Reply<Vec<Delivery>>,
    deadline: Option<Instant>,
}

/// The open polls. Invariant: every waiter with a deadline has exactly one entry in
/// `deadlines` and one in `index`, and nothing else is in them.
#[derive(Default)]
pub(super) struct Polls {
    waiters: BTreeMap<PollKey, Waiter>,
    deadlines: BTreeSet<(Instant, u64)>,
    index: BTreeMap<u64, PollKey>,
    next_id: u64,
}

impl Polls {
    /// Opens a poll; the caller has finished any earlier poll of the same key.
    fn open(&mut self, key: PollKey, reply: Reply<Vec<Delivery>>, deadline: Option<Instant>) {
        debug_assert!(!self.waiters.contains_key(&key), "one open poll per client");
        self.next_id += 1;
        let id = self.next_id;
        self.index.insert(id, key.clone());
        if let Some(t) = deadline {
            self.deadlines.insert((t, id));
        }
        self.waiters.insert(
            key,
            Waiter {
                id,
                got: Vec::new(),
                reply,
                deadline,
            },
        );
    }

    /// Removes a waiting poll with its index and deadline entries.
    pub fn take(&mut self, key: &PollKey) -> Option<Waiter> {
        let w = self.waiters.remove(key)?;
        self.index.remove(&w.id);
        if let Some(t) = w.deadline {
            self.deadlines.remove(&(t, w.id));
        }
        Some(w)
    }

    pub fn get_mut(&mut self, key: &PollKey) -> Option<&mut Waiter> {
        self.waiters.get_mut(key)
    }

    pub fn contains(&self, key: &PollKey) -> bool {
        self.waiters.contains_key(key)
    }

    /// The earliest poll deadline.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.first().map(|&(t, _)| t)
    }

    /// Takes the keys of polls whose deadline is at or before `now` off the deadline index.
    fn pop_due(&mut self, now: Instant) -> Vec<PollKey> {
        let mut due = Vec::new();
        while let Some(&(t, id)) = self.deadlines.first() {
            if t > now {
                break;
            }
            self.deadlines.pop_first();
            if let Some(key) = self.index.get(&id) {
                due.push(key.clone());
            }
        }
        due
    }

    /// Polls whose HTTP request went away (the reply channel is closed).
    fn closed(&self) -> Vec<PollKey> {
        self.waiters
            .iter()
            .filter(|(_, w)| w.reply.is_closed())
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Every open poll's key, optionally of one group only.
    pub fn keys(&self, group: Option<&GroupName>) -> Vec<PollKey> {
        self.waiters
            .keys()
            .filter(|(g, _)| group.is_none_or(|want| g == want))
            .cloned()
            .collect()
    }

    /// Removes every poll (the engine stops).
    pub fn take_all(&mut self) -> Vec<Waiter> {
        self.deadlines.clear();
        self.index.clear();
        std::mem::take(&mut self.waiters).into_values().collect()
    }
}

impl EngineTask {
    /// A long-poll: registers the waiter and gives the client its credit. A poll that
    /// does not wait (`wait_ms` 0) is answered with whatever the credit brought at once.
    pub(super) fn poll(
        &mut self,
        group: GroupName,
        client: ClientId,
        max: u32,
        wait_ms: u64,
        reply: Reply<Vec<Delivery>>,
    ) {
        let key = (group.clone(), client.clone());
        // A second poll from the same client ends the first with what it has; a poll ends
        // the client's stream too (one session per client).
        self.finish_waiter(&key);
        self.end_stream(&key);
        let deadline = (wait_ms > 0).then(|| Instant::now() + Duration::from_millis(wait_ms));
        self.polls.open(key.clone(), reply, deadline);
        match self.handle(Input::ClientPoll { group, client, max }) {
            Response::Refused(r) => {
                if let Some(w) = self.polls.take(&key) {
                    let _ = w.reply.send(Err(refusal(r, &key.0)));
                }
                self.to_finish.retain(|k| *k != key);
            }
            _ => {
                if deadline.is_none() && !self.to_finish.contains(&key) {
                    self.to_finish.push(key);
                }
            }
        }
        self.finish_pending();
    }

    /// Ends a poll: its credit is withdrawn and it is answered with what it got; if the
    /// request went away meanwhile, what it got goes back to the core at once.
    pub(super) fn finish_waiter(&mut self, key: &PollKey) {
        if self.polls.get_mut(key).is_none() {
            return;
        }
        // Withdraw what is left of the credit while the poll is still open: what the core
        // hands out meanwhile (timers due first) still lands in this poll's answer, and
        // nothing can be handed to the client once it is no longer waiting.
        let _ = self.handle(Input::ClientPoll {
            group: key.0.clone(),
            client: key.1.clone(),
            max: 0,
        });
        let Some(w) = self.polls.take(key) else {
            return;
        };
        if let Err(Ok(got)) = w.reply.send(Ok(w.got)) {
            // The HTTP request went away (client disconnected): hand the deliveries back.
            if !got.is_empty() {
                let ids = got.iter().map(|d| d.id).collect();
                let _ = self.handle(Input::Nack {
                    group: key.0.clone(),
                    ids,
                    delay_ms: Some(0),
                });
            }
        }
    }

    /// Answers the polls that received deliveries during the last inputs.
    pub(super) fn finish_pending(&mut self) {
        while let Some(key) = self.to_finish.pop() {
            self.finish_waiter(&key);
        }
    }

    /// Ends polls whose request went away (every 50 ms at most: a disconnected poll must
    /// lose its credit before the core hands it deliveries that could only come back as
    /// NACKs) and polls whose wait is over.
    pub(super) fn expire_polls(&mut self) {
        let now = Instant::now();
        if now.duration_since(self.last_closed_scan) >= Duration::from_millis(50) {
            self.last_closed_scan = now;
            for key in self.polls.closed() {
                self.finish_waiter(&key);
            }
        }
        for key in self.polls.pop_due(now) {
            self.finish_waiter(&key);
        }
    }
}
