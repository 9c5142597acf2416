//! The mesh: one state machine for every group, lane and client of one instance.
//!
//! # How to drive it
//! - `handle(now_ms, input)` for everything that happened; it answers requests directly.
//! - `poll_effect()` until `None` after every `handle`, and carry the effects out in order.
//! - `poll_timeout()` says when to call `handle(now, Input::Tick)` at the latest.
//!
//! # Rules of time
//! `now_ms` comes from the shell's monotonic clock. A `now_ms` below an earlier one is
//! treated as the earlier one (and counted): time never runs backwards inside the core.
//! Due timers fire at the start of every `handle`, so an input arriving after a deadline
//! sees the deadline's consequences first.
//!
//! # Durability
//! Nothing counts as durable until the shell reports `Persisted` for the ticket that
//! carried it: the epoch (no delivery is handed out before), attempt numbers >= 2 (no
//! redelivery before), dead letters, and the watermark that `Commit` reports.
//!
//! # Rooms
//! This module routes inputs and runs the pass after each one. The groups' table and
//! subscriptions are in `groups`, persists and tickets in `persist`, deadlines in `timers`,
//! read-only views in `views`, the invariant check in `invariants`; what one group does
//! with an input is in `crate::group`, what one lane does in `crate::lane`.

mod context;
mod groups;
mod invariants;
mod persist;
pub(crate) mod timers;
mod views;

use std::collections::BTreeMap;

pub(crate) use context::Ctx;
pub(crate) use invariants::Expected;
pub use timers::TimeoutReason;
pub use views::{ClientView, GroupView, LaneView};

use crate::checkpoint::Checkpoint;
use crate::config::{MeshConfig, SpecError};
use crate::group::{Group, GroupStats, Settling};
use crate::io::{Effect, Input, Recovered, Refusal, Response, REPLAY_PARTITION};
use crate::types::{Epoch, GroupName, Millis, Partition};
use groups::GroupTable;
use persist::Persistence;

/// Counters of the whole instance, for metrics and the simulation's fault accounting.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MeshStats {
    pub fetches: u64,
    pub fetch_failures: u64,
    pub stale_fetch_answers: u64,
    pub duplicate_records: u64,
    pub realigned_records: u64,
    pub gap_offsets: u64,
    pub skipped_retention: u64,
    pub truncations: u64,
    pub persists: u64,
    pub persist_failures: u64,
    pub unknown_tickets: u64,
    pub clock_regressions: u64,
    pub fetch_pauses_for_ranges: u64,
    /// The counters of groups removed in this incarnation, so totals over all groups never
    /// go down when a group is deleted (a falling counter reads as a reset to Prometheus).
    pub removed_group_totals: GroupStats,
}

/// Why a `Recovered` snapshot could not be used.
#[derive(Clone, Debug, PartialEq)]
pub enum RecoveryError {
    EpochExhausted,
    DuplicateGroup(GroupName),
    TooManyGroups { max: usize },
    InvalidSubscription { group: GroupName, error: SpecError },
}

impl std::fmt::Display for RecoveryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecoveryError::EpochExhausted => write!(f, "the epoch counter is exhausted"),
            RecoveryError::DuplicateGroup(g) => write!(f, "group {g} is stored twice"),
            RecoveryError::TooManyGroups { max } => {
                write!(f, "more stored groups than max_groups ({max})")
            }
            RecoveryError::InvalidSubscription { group, error } => {
                write!(
                    f,
                    "stored group {group} is invalid under this configuration: {error}"
                )
            }
        }
    }
}

impl std::error::Error for RecoveryError {}

/// The pure delivery core of one unimesh instance. See the module documentation.
pub struct Mesh {
    cx: Ctx,
    groups: GroupTable,
    persistence: Persistence,
    /// Checkpoints read at start, waiting for their partition to be assigned.
    recovered: BTreeMap<(GroupName, Partition), Checkpoint>,
    /// Check every invariant after every `handle` (tests, simulation, debug builds).
    pub check_every_step: bool,
}

impl Mesh {
    /// Builds the mesh from what the stores kept. The new epoch is persisted first: no
    /// delivery is handed out until it is durable, so ids can never repeat across restarts.
    pub fn new(
        config: MeshConfig,
        recovered: Recovered,
        now_ms: Millis,
    ) -> Result<Self, RecoveryError> {
        let epoch = recovered
            .epoch
            .checked_add(1)
            .ok_or(RecoveryError::EpochExhausted)?;
        if recovered.subscriptions.len() > config.max_groups {
            return Err(RecoveryError::TooManyGroups {
                max: config.max_groups,
            });
        }
        let mut mesh = Mesh {
            cx: Ctx::new(config, epoch, now_ms),
            groups: GroupTable::default(),
            persistence: Persistence::default(),
            recovered: BTreeMap::new(),
            check_every_step: cfg!(debug_assertions),
        };
        for spec in recovered.subscriptions {
            if mesh.groups.slot_of(&spec.group).is_some() {
                return Err(RecoveryError::DuplicateGroup(spec.group));
            }
            spec.validate(&mesh.cx.config.limits).map_err(|error| {
                RecoveryError::InvalidSubscription {
                    group: spec.group.clone(),
                    error,
                }
            })?;
            let g = mesh.groups.add(spec, mesh.cx.next_lease);
            if let Some(group) = mesh.groups.get_mut(g) {
                group.set_spec_durable();
            }
        }
        for (group, partition, checkpoint) in recovered.checkpoints {
            // Checkpoints of groups that no longer exist are ignored, never resurrected.
            if mesh.groups.slot_of(&group).is_some() && partition != REPLAY_PARTITION {
                mesh.recovered.insert((group, partition), checkpoint);
            }
        }
        mesh.flush();
        Ok(mesh)
    }

    pub fn epoch(&self) -> Epoch {
        self.cx.epoch
    }

    /// True once the epoch is durable and deliveries can be handed out.
    pub fn is_ready(&self) -> bool {
        self.cx.dispatch_enabled
    }

    pub fn config(&self) -> &MeshConfig {
        &self.cx.config
    }

    pub fn stats(&self) -> &MeshStats {
        &self.cx.stats
    }

    pub fn now(&self) -> Millis {
        self.cx.now
    }

    /// The next effect to carry out, in order.
    pub fn poll_effect(&mut self) -> Option<Effect> {
        self.cx.effects.pop_front()
    }

    /// When `handle(now, Input::Tick)` must be called at the latest. It can be earlier than
    /// any real deadline (an ACK deadline whose delivery was settled since, an idle client
    /// that was busy in between): such a Tick finds nothing due and moves the timer on.
    pub fn poll_timeout(&self) -> Option<Millis> {
        self.cx.timers.next().map(|(t, _)| t)
    }

    /// `poll_timeout` with what the deadline is for.
    pub fn poll_timeout_reason(&self) -> Option<(Millis, TimeoutReason)> {
        self.cx.timers.next().map(|(t, timer)| (t, timer.reason()))
    }

    /// Feeds one input; returns the answer to it. Effects are queued for `poll_effect`.
    pub fn handle(&mut self, now_ms: Millis, input: Input) -> Response {
        if now_ms < self.cx.now {
            self.cx.stats.clock_regressions += 1;
        } else {
            self.cx.now = now_ms;
        }
        self.fire_timers();
        let response = match input {
            Input::Ack { group, ids } => {
                self.on_group(&group, |g, cx| g.settle_ids(cx, &ids, Settling::Ack))
            }
            Input::ClientGone { group, client } => {
                self.on_group(&group, |g, cx| g.client_gone(cx, &client))
            }
            Input::ClientPoll { group, client, max } => {
                self.on_group(&group, |g, cx| g.client_poll(cx, client, max))
            }
            Input::Extend {
                group,
                ids,
                extend_ms,
            } => self.on_group(&group, |g, cx| {
                g.settle_ids(cx, &ids, Settling::Extend(extend_ms))
            }),
            Input::Fetched {
                group,
                partition,
                fetch_id,
                result,
            } => match self.groups.named_mut(&group) {
                Some(g) => g.fetched(&mut self.cx, partition, fetch_id, result),
                None => {
                    self.cx.stats.stale_fetch_answers += 1;
                    Response::Refused(Refusal::UnknownGroup)
                }
            },
            Input::FlushNow => {
                self.flush();
                Response::Ok
            }
            Input::Nack {
                group,
                ids,
                delay_ms,
            } => self.on_group(&group, |g, cx| {
                g.settle_ids(cx, &ids, Settling::Nack(delay_ms))
            }),
            Input::PartitionsAssigned { group, partitions } => {
                match self.groups.named_mut(&group) {
                    Some(g) => g.assign(&mut self.cx, &mut self.recovered, partitions),
                    None => Response::Refused(Refusal::UnknownGroup),
                }
            }
            Input::PartitionsRevoking { group, partitions } => {
                self.on_group(&group, |g, cx| g.start_revoke(cx, &partitions))
            }
            Input::PartitionsRevoked { group, partitions } => {
                self.on_group(&group, |g, cx| g.revoke(cx, &partitions))
            }
            Input::PersistFailed { ticket } => self.persist_failed(ticket),
            Input::Persisted { ticket } => self.persisted(ticket),
            Input::Replay { group, records } => {
                self.on_group(&group, |g, cx| g.replay(cx, records))
            }
            Input::Seek {
                group,
                partition,
                offset,
            } => self.on_group(&group, |g, cx| g.seek(cx, partition, offset)),
            Input::Subscribe(spec) => self.subscribe(spec),
            Input::Tick => Response::Ok,
            Input::Unsubscribe { group } => self.unsubscribe(&group),
        };
        self.after_input();
        if self.check_every_step {
            if let Err(violation) = self.check_invariants() {
                panic!("unimesh-core invariant violated: {violation}");
            }
        }
        response
    }

    /// Hands an input to the group it names, or refuses it for an unknown group.
    fn on_group(
        &mut self,
        name: &GroupName,
        f: impl FnOnce(&mut Group, &mut Ctx) -> Response,
    ) -> Response {
        match self.groups.named_mut(name) {
            Some(group) => f(group, &mut self.cx),
            None => Response::Refused(Refusal::UnknownGroup),
        }
    }

    /// After every input: fetch where there is room, hand out what can be handed out, and
    /// make sure dirty state will be flushed.
    fn after_input(&mut self) {
        let lanes = self.cx.take_touched_lanes();
        for &(g, p) in &lanes {
            if let Some(group) = self.groups.get_mut(g) {
                group.visit_lane(&mut self.cx, p);
            }
        }
        self.cx.return_touched_lanes(lanes);
        let groups = self.cx.take_touched_groups();
        for &g in &groups {
            if let Some(group) = self.groups.get_mut(g) {
                group.clear_touched();
                group.dispatch(&mut self.cx);
            }
        }
        self.cx.return_touched_groups(groups);
        self.persistence.arm_flush(&mut self.cx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SubscriptionSpec;
    use crate::io::{Assignment, FetchResult};
    use crate::record::{EventMeta, Record};
    use crate::types::{ClientId, TopicName};

    fn ok(response: Response) {
        assert_eq!(response, Response::Ok);
    }

    fn drain(mesh: &mut Mesh) -> Vec<Effect> {
        std::iter::from_fn(|| mesh.poll_effect()).collect()
    }

    /// Goal: `poll_timeout_reason` names what `poll_timeout` is for. Method: walk a mesh
    /// from start to one delivery; at each step the earliest deadline is a known one.
    #[test]
    fn the_next_timeout_says_what_it_is_for() {
        let config = MeshConfig::default();
        let (flush_ms, ack_ms) = (config.flush_interval_ms, 30_000);
        let mut mesh = Mesh::new(config, Recovered::default(), 0).expect("fresh mesh");
        let ticket = match drain(&mut mesh).as_slice() {
            [Effect::Persist { ticket, .. }] => *ticket,
            other => panic!("expected the epoch's persist, got {other:?}"),
        };
        assert_eq!(mesh.poll_timeout_reason(), None);

        let group = GroupName::new("g").expect("valid name");
        let mut spec = SubscriptionSpec::new(group.clone(), TopicName::new("t").expect("valid"));
        spec.ack_timeout_ms = ack_ms;
        assert_eq!(mesh.handle(0, Input::Subscribe(spec)), Response::Ok);
        assert_eq!(
            mesh.poll_timeout_reason(),
            Some((flush_ms, TimeoutReason::Flush))
        );
        assert_eq!(mesh.poll_timeout(), Some(flush_ms));

        ok(mesh.handle(1, Input::Persisted { ticket }));
        let partitions = vec![Assignment {
            partition: 0,
            earliest: 0,
            end: 0,
            checkpoint: None,
        }];
        ok(mesh.handle(
            1,
            Input::PartitionsAssigned {
                group: group.clone(),
                partitions,
            },
        ));
        let client = ClientId::new("c").expect("valid name");
        ok(mesh.handle(
            1,
            Input::ClientPoll {
                group: group.clone(),
                client,
                max: 1,
            },
        ));
        let fetch_id = drain(&mut mesh)
            .iter()
            .find_map(|e| match e {
                Effect::Fetch { fetch_id, .. } => Some(*fetch_id),
                _ => None,
            })
            .expect("the new lane fetches");
        let record = Record::event(0, EventMeta::default(), Default::default());
        let result = FetchResult::Records(vec![record]);
        ok(mesh.handle(
            2,
            Input::Fetched {
                group,
                partition: 0,
                fetch_id,
                result,
            },
        ));
        ok(mesh.handle(2, Input::FlushNow));
        assert!(drain(&mut mesh)
            .iter()
            .any(|e| matches!(e, Effect::Deliver { .. })));
        assert_eq!(
            mesh.poll_timeout_reason(),
            Some((2 + ack_ms, TimeoutReason::AckDeadline))
        );
    }
}
