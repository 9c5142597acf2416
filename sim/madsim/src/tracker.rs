//! The harness's own checks of how the shell hands the core's effects to clients, which the
//! checker (fed from the tap) cannot see:
//! - every delivery the mesh handed out reaches the poll it was handed to, or goes back to
//!   the mesh at once (a NACK, the client gone) — nothing waits out its ACK timeout in
//!   limbo because the poll it was meant for had gone (upstream #5282; C1, liveness);
//! - a poll's answer holds only deliveries the mesh handed to that client, each once, and
//!   no more than it asked for (C8);
//! - the answer a client gets to an ACK, NACK or extend is the mesh's answer (C4).
//!
//! "At once" is judged on the simulated clock without clock jumps: when a poll ends (the
//! engine withdraws its credit), the answer or the hand-back is carried out by tasks that
//! are ready at that very instant; anything still undecided 1 ms later never will be.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use unimesh_core::{ClientId, DeliveryId, GroupName, Response, Settle};
use unimesh_shell::engine::EngineError;
use unimesh_sim::{Clause, SettleKind, Violation};

use crate::world::violation;

/// How long after its poll ended a delivery may still be on its way.
const AT_ONCE: Duration = Duration::from_millis(1);

type Key = (GroupName, ClientId);

/// One delivery handed out and not yet received nor given back.
struct Out {
    key: Key,
    /// When the poll it was handed to ended.
    closed: Option<Duration>,
}

#[derive(Default)]
pub struct Tracker {
    out: BTreeMap<DeliveryId, Out>,
    by_key: BTreeMap<Key, BTreeSet<DeliveryId>>,
    /// (poll end, delivery) of deliveries whose poll ended, oldest first.
    due: BTreeSet<(Duration, DeliveryId)>,
    /// The mesh's answers to settles, by (group, kind, ids), for the front to compare.
    answers: BTreeMap<(GroupName, u8, Vec<DeliveryId>), VecDeque<Response>>,
}

fn kind_code(kind: SettleKind) -> u8 {
    match kind {
        SettleKind::Ack => 0,
        SettleKind::Nack(_) => 1,
        SettleKind::Extend(_) => 2,
    }
}

impl Tracker {
    /// The mesh handed `id` to `client` of `group`.
    pub fn delivered(&mut self, group: &GroupName, client: &ClientId, id: DeliveryId) {
        let key = (group.clone(), client.clone());
        self.by_key.entry(key.clone()).or_default().insert(id);
        self.out.insert(id, Out { key, closed: None });
    }

    /// The mesh took a poll's credit: `max` 0 ends the poll, so what it was handed is due.
    pub fn credit(&mut self, group: &GroupName, client: &ClientId, max: u32, now: Duration) {
        if max > 0 {
            return;
        }
        let key = (group.clone(), client.clone());
        let Some(ids) = self.by_key.get(&key) else {
            return;
        };
        for id in ids {
            if let Some(o) = self.out.get_mut(id) {
                if o.closed.is_none() {
                    o.closed = Some(now);
                    self.due.insert((now, *id));
                }
            }
        }
    }

    fn remove(&mut self, id: &DeliveryId) -> Option<Out> {
        let o = self.out.remove(id)?;
        if let Some(ids) = self.by_key.get_mut(&o.key) {
            ids.remove(id);
            if ids.is_empty() {
                self.by_key.remove(&o.key);
            }
        }
        Some(o)
    }

    /// ACKed or NACKed (by a client, or given back by the engine itself). Returns how many
    /// of `ids` were handed to a poll that had ended and never reached its request: only
    /// the engine can settle those (a client knows no id it did not receive), so this
    /// counts the hand-backs of #5282 — proof that a sweep exercises that path.
    pub fn settled(&mut self, ids: &[DeliveryId]) -> u64 {
        let mut handed_back = 0;
        for id in ids {
            if self.remove(id).is_some_and(|o| o.closed.is_some()) {
                handed_back += 1;
            }
        }
        handed_back
    }

    /// The mesh was told the client left: it takes back what the client held. What was
    /// handed to a poll that already ended is on its way to the request all the same (an
    /// eviction ends the client's poll first), so it stays owed.
    pub fn gone(&mut self, group: &GroupName, client: &ClientId) {
        let key = (group.clone(), client.clone());
        let open: Vec<DeliveryId> = self
            .by_key
            .get(&key)
            .into_iter()
            .flatten()
            .filter(|id| self.out.get(id).is_some_and(|o| o.closed.is_none()))
            .copied()
            .collect();
        for id in open {
            self.remove(&id);
        }
    }

    /// A poll's answer reached its request.
    pub fn received(
        &mut self,
        group: &GroupName,
        client: &ClientId,
        max: u32,
        got: &[DeliveryId],
    ) -> Result<(), Violation> {
        if got.len() > max as usize {
            return Err(violation(
                Clause::C8,
                format!(
                    "{group}: a poll for {max} of {client} was answered with {}",
                    got.len()
                ),
            ));
        }
        for id in got {
            match self.remove(id) {
                Some(o) if o.key.0 == *group && o.key.1 == *client => {}
                _ => {
                    return Err(violation(
                        Clause::C8,
                        format!(
                            "{group}: {client} received {} which the mesh did not hand it (or not once)",
                            id
                        ),
                    ))
                }
            }
        }
        Ok(())
    }

    /// Deliveries whose poll ended more than [`AT_ONCE`] ago and that are still undecided;
    /// with `final_check`, also those whose poll never ended.
    pub fn check(&mut self, now: Duration, final_check: bool) -> Result<(), Violation> {
        while let Some(&(closed, id)) = self.due.first() {
            if closed + AT_ONCE > now {
                break;
            }
            self.due.pop_first();
            if let Some(o) = self.out.get(&id) {
                return Err(violation(
                    Clause::C1,
                    format!(
                        "{}: delivery {id} to {} went neither to its poll nor back to the mesh \
                         when the poll ended (stranded until its ACK timeout, #5282)",
                        o.key.0, o.key.1
                    ),
                ));
            }
        }
        if final_check {
            if let Some((id, o)) = self.out.iter().next() {
                return Err(violation(
                    Clause::C1,
                    format!(
                        "{}: delivery {id} to {} is stuck in a poll that never ended",
                        o.key.0, o.key.1
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The node died: nothing it handed out is owed any more.
    pub fn clear(&mut self) {
        self.out.clear();
        self.by_key.clear();
        self.due.clear();
        self.answers.clear();
    }

    /// The mesh answered a settle (recorded for [`Tracker::answered`]).
    pub fn mesh_answered(
        &mut self,
        group: &GroupName,
        kind: SettleKind,
        ids: &[DeliveryId],
        response: &Response,
    ) {
        let q = self
            .answers
            .entry((group.clone(), kind_code(kind), ids.to_vec()))
            .or_default();
        // Hand-backs by the engine itself are never asked for; keep the queue short.
        if q.len() >= 8 {
            q.pop_front();
        }
        q.push_back(response.clone());
    }

    /// A client's settle request got `answer`: the mesh's answer to it, as the shell maps
    /// it (settled per id; refused; `Ok` only for an empty list). Identical requests may
    /// come back in another order than the mesh took them: any of their answers will do.
    pub fn answered(
        &mut self,
        group: &GroupName,
        kind: SettleKind,
        ids: &[DeliveryId],
        answer: &Result<Vec<Settle>, EngineError>,
    ) -> Result<(), Violation> {
        let key = (group.clone(), kind_code(kind), ids.to_vec());
        let Some(queue) = self.answers.get_mut(&key) else {
            // The request never reached the mesh (refused before, or the engine stopped).
            return Ok(());
        };
        let same = |mesh: &Response| match (mesh, answer) {
            (Response::Settled(m), Ok(a)) => m == a,
            (Response::Refused(_), Err(_)) => true,
            (Response::Ok, Ok(a)) => a.is_empty(),
            _ => false,
        };
        if let Some(i) = queue.iter().position(same) {
            queue.remove(i);
            return Ok(());
        }
        if matches!(answer, Err(EngineError::Unavailable(_))) {
            // This one never reached the mesh (it stopped); an identical one did.
            return Ok(());
        }
        Err(violation(
            Clause::C4,
            format!("{group}: {kind:?} of {ids:?}: the mesh answered {queue:?}, the client got {answer:?}"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use unimesh_core::{Delivery, Record, RecordMeta, RejectReason, TopicName};

    use super::*;

    fn names() -> (GroupName, ClientId) {
        (GroupName::new("g").unwrap(), ClientId::new("c").unwrap())
    }

    fn id(offset: u64) -> DeliveryId {
        DeliveryId {
            epoch: 1,
            lease: 1,
            partition: 0,
            offset,
            attempt: 1,
        }
    }

    fn delivery(offset: u64) -> Delivery {
        Delivery {
            id: id(offset),
            attempt: 1,
            topic: TopicName::new("t").unwrap(),
            partition: 0,
            record: Record {
                offset,
                meta: RecordMeta::Undecodable(Arc::from("test")),
                body: bytes::Bytes::new(),
                broker_handle: None,
            },
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_delivery_of_an_ended_poll_must_be_received_or_given_back_at_once() {
        let (g, c) = names();
        let mut t = Tracker::default();
        t.delivered(&g, &c, id(1));
        t.delivered(&g, &c, id(2));
        t.credit(&g, &c, 0, ms(10));
        assert!(t.check(ms(10), false).is_ok(), "not due yet");
        t.received(&g, &c, 2, &[delivery(1).id]).unwrap();
        let v = t.check(ms(12), false).unwrap_err();
        assert_eq!(v.clause, Clause::C1);
        assert!(v.message.contains("1.1.0.2.1"), "{v}");
    }

    #[test]
    fn given_back_or_received_in_time_is_fine_and_an_open_poll_is_owed_only_at_the_end() {
        let (g, c) = names();
        let mut t = Tracker::default();
        t.delivered(&g, &c, id(1));
        t.delivered(&g, &c, id(2));
        t.credit(&g, &c, 0, ms(10));
        assert_eq!(t.settled(&[id(1)]), 1, "a hand-back of an ended poll");
        t.received(&g, &c, 1, &[delivery(2).id]).unwrap();
        assert!(t.check(ms(50), true).is_ok());
        t.delivered(&g, &c, id(3));
        assert_eq!(
            t.settled(&[id(2), id(3)]),
            0,
            "received, or of an open poll"
        );
        t.delivered(&g, &c, id(3));
        assert!(t.check(ms(60), false).is_ok());
        assert_eq!(t.check(ms(60), true).unwrap_err().clause, Clause::C1);
    }

    #[test]
    fn an_eviction_keeps_what_is_on_its_way_to_the_ended_poll() {
        let (g, c) = names();
        let mut t = Tracker::default();
        t.delivered(&g, &c, id(1));
        t.credit(&g, &c, 0, ms(10));
        t.gone(&g, &c);
        t.received(&g, &c, 1, &[delivery(1).id]).unwrap();
        assert!(t.check(ms(20), true).is_ok());
    }

    #[test]
    fn a_poll_answer_holds_only_what_the_mesh_handed_that_client_once_within_max() {
        let (g, c) = names();
        let other = ClientId::new("other").unwrap();
        let mut t = Tracker::default();
        t.delivered(&g, &other, id(1));
        assert_eq!(
            t.received(&g, &c, 5, &[delivery(1).id]).unwrap_err().clause,
            Clause::C8
        );
        t.delivered(&g, &c, id(2));
        t.received(&g, &c, 5, &[delivery(2).id]).unwrap();
        assert_eq!(
            t.received(&g, &c, 5, &[delivery(2).id]).unwrap_err().clause,
            Clause::C8
        );
        t.delivered(&g, &c, id(3));
        t.delivered(&g, &c, id(4));
        let two = [delivery(3), delivery(4)];
        assert_eq!(
            t.received(&g, &c, 1, &two.map(|d| d.id))
                .unwrap_err()
                .clause,
            Clause::C8
        );
    }

    #[test]
    fn a_settle_answer_must_be_one_the_mesh_gave() {
        let (g, _) = names();
        let mut t = Tracker::default();
        let ids = [id(1)];
        let accepted = Response::Settled(vec![Settle::Accepted]);
        let done = Response::Settled(vec![Settle::Rejected(RejectReason::AlreadyDone)]);
        t.mesh_answered(&g, SettleKind::Ack, &ids, &accepted);
        t.mesh_answered(&g, SettleKind::Ack, &ids, &done);
        // The two identical ACKs come back in the other order: both match.
        t.answered(
            &g,
            SettleKind::Ack,
            &ids,
            &Ok(vec![Settle::Rejected(RejectReason::AlreadyDone)]),
        )
        .unwrap();
        t.answered(&g, SettleKind::Ack, &ids, &Ok(vec![Settle::Accepted]))
            .unwrap();
        // One that never reached the mesh.
        let stopped = Err(EngineError::Unavailable("the engine has stopped".into()));
        t.answered(&g, SettleKind::Ack, &ids, &stopped).unwrap();
        // One the mesh never gave.
        t.mesh_answered(&g, SettleKind::Ack, &ids, &accepted);
        let wrong = Ok(vec![Settle::Rejected(RejectReason::Stale)]);
        assert_eq!(
            t.answered(&g, SettleKind::Ack, &ids, &wrong)
                .unwrap_err()
                .clause,
            Clause::C4
        );
    }
}
