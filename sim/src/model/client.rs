//! A model client of one group: polls for credit, and settles each delivery according to a
//! plan drawn when it arrives — ACK (possibly late, twice, or after an extension), NACK with
//! a delay, or never. A poison record is never ACKed. The client keeps ids it has seen, so
//! it can ACK them again later, including after the mesh restarted (stale ids).
//!
//! In a cluster a client polls one instance at a time (its *home*, as a load balancer
//! would pick it) and may move to another; it settles each delivery at the instance that
//! issued it, and sends its stale ACKs wherever it is.

use std::collections::{BTreeSet, VecDeque};

use unimesh_core::{ClientId, DeliveryId, Millis};

use crate::checker::SettleKind;
use crate::options::ClientOptions;
use crate::rng::Rng;

/// How many past ids a client remembers for stale and double ACKs.
const PAST_IDS: usize = 32;

#[derive(Clone, Debug)]
pub struct Client {
    pub group: usize,
    pub id: ClientId,
    pub opts: ClientOptions,
    /// Per instance: whether that instance's mesh knows the client (it polled there since
    /// the mesh started, and did not leave).
    pub connected: Vec<bool>,
    /// The instance it polls now.
    pub home: usize,
    /// Deliveries it holds, with the instance that issued each.
    pub held: BTreeSet<(usize, DeliveryId)>,
    past: VecDeque<DeliveryId>,
}

/// What the client will do with one delivery, as (after how long, what).
pub type Plan = Vec<(Millis, SettleKind)>;

/// Counts of the behaviours drawn, for the fault report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behaviour {
    Ack,
    LateAck,
    DoubleAck,
    Nack,
    Ignore,
    Extend,
}

impl Client {
    pub fn new(group: usize, id: ClientId, opts: ClientOptions, instances: usize) -> Self {
        Self {
            group,
            id,
            opts,
            connected: vec![false; instances.max(1)],
            home: 0,
            held: BTreeSet::new(),
            past: VecDeque::new(),
        }
    }

    pub fn remember(&mut self, id: DeliveryId) {
        if self.past.len() == PAST_IDS {
            self.past.pop_front();
        }
        self.past.push_back(id);
    }

    pub fn past_id(&self, rng: &mut Rng) -> Option<DeliveryId> {
        if self.past.is_empty() {
            return None;
        }
        Some(self.past[rng.index(self.past.len())])
    }

    /// Draws what to do with a delivery. In liveness mode every healthy record is ACKed
    /// within its timeout; a poison record is never ACKed in any mode.
    pub fn plan(
        &self,
        rng: &mut Rng,
        poison: bool,
        ack_timeout_ms: Millis,
        liveness: bool,
    ) -> (Plan, Behaviour) {
        let o = &self.opts;
        let quick = |rng: &mut Rng| rng.range(0, (ack_timeout_ms / 2).min(o.ack_delay_ms));
        if poison {
            return if rng.chance(0.5) {
                let delay = rng.chance(0.5).then(|| rng.range(0, 100));
                (vec![(quick(rng), SettleKind::Nack(delay))], Behaviour::Nack)
            } else {
                (Vec::new(), Behaviour::Ignore)
            };
        }
        if liveness {
            return (vec![(quick(rng), SettleKind::Ack)], Behaviour::Ack);
        }
        let total = o.ack + o.nack + o.ignore + o.late_ack + o.double_ack + o.extend;
        let mut x = rng.unit() * total;
        let mut pick = |w: f64| {
            x -= w;
            x < 0.0
        };
        if pick(o.ack) {
            (
                vec![(rng.range(0, o.ack_delay_ms), SettleKind::Ack)],
                Behaviour::Ack,
            )
        } else if pick(o.nack) {
            let delay = rng.chance(0.5).then(|| rng.range(0, 200));
            (
                vec![(rng.range(0, o.ack_delay_ms), SettleKind::Nack(delay))],
                Behaviour::Nack,
            )
        } else if pick(o.ignore) {
            (Vec::new(), Behaviour::Ignore)
        } else if pick(o.late_ack) {
            let after = ack_timeout_ms + rng.range(0, 3 * ack_timeout_ms);
            (vec![(after, SettleKind::Ack)], Behaviour::LateAck)
        } else if pick(o.double_ack) {
            let first = rng.range(0, o.ack_delay_ms);
            let second = first + rng.range(0, 2 * ack_timeout_ms);
            (
                vec![(first, SettleKind::Ack), (second, SettleKind::Ack)],
                Behaviour::DoubleAck,
            )
        } else {
            let first = rng.range(0, (ack_timeout_ms / 2).max(1));
            let by = rng.chance(0.7).then(|| rng.range(1, 2 * ack_timeout_ms));
            let ack = first + rng.range(0, ack_timeout_ms);
            (
                vec![(first, SettleKind::Extend(by)), (ack, SettleKind::Ack)],
                Behaviour::Extend,
            )
        }
    }
}
