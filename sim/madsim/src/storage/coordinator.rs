//! The group coordinator of the Kafka shapes: madsim-rdkafka's simulated broker has no
//! consumer groups, so the harness plays Kafka's group coordinator for the shell's
//! simulated consumer (`unimesh_shell::kafka::SimCoordinator`), which drives the same
//! `rules/` as the librdkafka consumer that ships.
//!
//! What it models, per consumer group (one per subscription group):
//! - membership: a member joins, heartbeats, leaves; a member that has not heartbeaten
//!   for the session timeout is expired (a killed node, a paused one, one whose heartbeats
//!   are lost: a *zombie*, which keeps running and learns it was expelled only at its next
//!   heartbeat that gets through);
//! - generations: the group's generation goes up whenever partitions are handed out, and
//!   every member is told the new one with its (possibly empty) incremental assignment;
//! - cooperative-sticky incremental assignment: each member keeps what it owns up to its
//!   fair share; what is over it is revoked first (`Rebalance::Revoke`, not lost) and
//!   handed to another member only once the owner's callback returned (its progress is
//!   durable and committed then), in a later generation; a member whose revocation takes
//!   longer than the rebalance timeout is expelled, and partitions of an expired member
//!   are free at once;
//! - commits: taken from a member of the current generation only (Kafka fences the
//!   commits of a replaced owner); each one taken is reported to the world, whose checker
//!   judges it (C3); committed offsets are what an assignment reads back.
//!
//! Everything is in one lock on the one simulator thread, in `BTreeMap` order; rebalances
//! are sent as the state changes, and a task of the coordinator's node expires sessions.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use madsim::runtime::NodeHandle;
use madsim_tokio as tokio;
use tokio::sync::mpsc::UnboundedSender;
use tokio::time::Instant;
use unimesh_core::{GroupName, Offset, Partition};
use unimesh_shell::kafka::{MemberId, Rebalance, SimCoordinator};

use crate::options::ClusterOptions;
use crate::world::World;

/// The coordinator's timing (simulated time).
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub session: Duration,
    pub heartbeat: Duration,
    /// How long a member's revocation may take before the member is expelled.
    pub rebalance_timeout: Duration,
}

impl Timing {
    pub fn of(c: &ClusterOptions) -> Self {
        let ms = |v: u64, default: u64| Duration::from_millis(if v == 0 { default } else { v });
        Self {
            session: ms(c.session_ms, 1_000),
            heartbeat: ms(c.heartbeat_ms, 100),
            rebalance_timeout: ms(c.rebalance_timeout_ms, 5_000),
        }
    }
}

/// Kafka's group coordinator, for every group of the run (see the module documentation).
pub struct Coordinator {
    world: Arc<World>,
    timing: Timing,
    /// Partitions of the topic every group reads.
    partitions: u32,
    /// The prefix of a group id before the subscription group's name.
    group_prefix: String,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    next_member: MemberId,
    groups: BTreeMap<String, Group>,
    /// The group id of each member.
    member_group: BTreeMap<MemberId, String>,
    /// Until when the heartbeats of each mesh node are lost.
    deaf_until: BTreeMap<usize, Instant>,
}

#[derive(Default)]
struct Group {
    /// The group's number in the trace (`World::tag`).
    number: u64,
    generation: i32,
    members: BTreeMap<MemberId, Member>,
    owner: BTreeMap<Partition, MemberId>,
    /// Partitions whose revocation was sent to their owner, and when.
    revoking: BTreeMap<Partition, Instant>,
    committed: BTreeMap<Partition, Offset>,
}

struct Member {
    node: usize,
    callbacks: UnboundedSender<Rebalance>,
    last_heartbeat: Instant,
}

impl Coordinator {
    pub fn new(world: Arc<World>, timing: Timing, partitions: u32, group_prefix: String) -> Self {
        Self {
            world,
            timing,
            partitions,
            group_prefix,
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts expiring sessions and slow revocations, on `node` (the coordinator's own).
    pub fn start(self: &Arc<Self>, node: &NodeHandle) {
        let c = self.clone();
        node.spawn(async move {
            let every = c.timing.heartbeat / 2;
            while !c.world.is_done() {
                tokio::time::sleep(every.max(Duration::from_millis(1))).await;
                c.expire();
            }
        });
    }

    /// The heartbeats of mesh node `node` are lost for `for_ms` from now (it goes on as if
    /// nothing happened: a zombie once its sessions expire).
    pub fn lose_heartbeats(&self, node: usize, for_ms: u64) {
        let until = Instant::now() + Duration::from_millis(for_ms);
        self.lock().deaf_until.insert(node, until);
        self.world
            .note_at(node, "heartbeats-lost", [for_ms, 0, 0, 0]);
        self.world.count(|c| &mut c.heartbeat_losses);
    }

    /// Whether an assignment of `partition` of `group` that mesh node `node` acts on now was
    /// overtaken: the partition's owner here is no member of that node (its member was
    /// expelled, or the partition handed on, since the assignment was sent).
    pub fn overtaken(&self, node: usize, group: &GroupName, partition: Partition) -> bool {
        let id = format!("{}{group}", self.group_prefix);
        let st = self.lock();
        let Some(g) = st.groups.get(&id) else {
            return false;
        };
        g.owner
            .get(&partition)
            .and_then(|m| g.members.get(m))
            .is_none_or(|m| m.node != node)
    }

    /// A handle of the coordinator for the members on mesh node `node`.
    pub fn for_node(self: &Arc<Self>, node: usize) -> Arc<dyn SimCoordinator> {
        Arc::new(NodeCoordinator {
            coordinator: self.clone(),
            node,
        })
    }

    /// Expels every member whose session expired or whose revocation took too long.
    fn expire(&self) {
        let now = Instant::now();
        let mut st = self.lock();
        let ids: Vec<String> = st.groups.keys().cloned().collect();
        for id in ids {
            let Some(g) = st.groups.get(&id) else {
                continue;
            };
            let mut gone: BTreeSet<MemberId> = g
                .members
                .iter()
                .filter(|(_, m)| now.duration_since(m.last_heartbeat) > self.timing.session)
                .map(|(&m, _)| m)
                .collect();
            for (p, &asked) in &g.revoking {
                if now.duration_since(asked) > self.timing.rebalance_timeout {
                    gone.extend(g.owner.get(p).copied());
                }
            }
            if gone.is_empty() {
                continue;
            }
            for m in &gone {
                self.remove(&mut st, &id, *m, "member-expired");
                self.world.count(|c| &mut c.members_expired);
            }
            self.rebalance(&mut st, &id);
        }
    }

    /// Takes `member` out of its group; what it owned is free (and, when the member was
    /// expelled rather than left, its mesh holds it fenced from now on).
    fn remove(&self, st: &mut State, id: &str, member: MemberId, why: &'static str) {
        st.member_group.remove(&member);
        let Some(g) = st.groups.get_mut(id) else {
            return;
        };
        let Some(m) = g.members.remove(&member) else {
            return;
        };
        let owned: Vec<Partition> = g
            .owner
            .iter()
            .filter(|(_, &o)| o == member)
            .map(|(&p, _)| p)
            .collect();
        for p in &owned {
            g.owner.remove(p);
            g.revoking.remove(p);
        }
        self.world
            .note_at(m.node, why, [member, owned.len() as u64, 0, g.number]);
        if why != "member-left" {
            if let Some(group) = self.group_name(id) {
                self.world.lanes_expired(m.node, &group, &owned);
            }
        }
    }

    /// Cooperative-sticky: revokes what a member holds over its fair share, then hands the
    /// free partitions to the members under theirs, in a new generation told to every
    /// member.
    fn rebalance(&self, st: &mut State, id: &str) {
        let Some(g) = st.groups.get_mut(id) else {
            return;
        };
        let members: Vec<MemberId> = g.members.keys().copied().collect();
        if members.is_empty() {
            return;
        }
        let n = members.len() as u32;
        let quota = |i: usize| self.partitions / n + u32::from((i as u32) < self.partitions % n);
        let now = Instant::now();
        // What each member keeps: what it owns and is not giving up, up to its quota.
        let mut keeps: BTreeMap<MemberId, Vec<Partition>> = BTreeMap::new();
        for (i, &m) in members.iter().enumerate() {
            let held: Vec<Partition> = g
                .owner
                .iter()
                .filter(|(p, &o)| o == m && !g.revoking.contains_key(p))
                .map(|(&p, _)| p)
                .collect();
            let q = quota(i) as usize;
            if held.len() > q {
                let excess = held[q..].to_vec();
                for &p in &excess {
                    g.revoking.insert(p, now);
                }
                if let Some(member) = g.members.get(&m) {
                    self.world.note_at(
                        member.node,
                        "revoke",
                        [m, excess.len() as u64, u64::from(excess[0]), g.number],
                    );
                    let _ = member.callbacks.send(Rebalance::Revoke {
                        partitions: excess,
                        lost: false,
                    });
                }
            }
            keeps.insert(m, held.into_iter().take(q).collect());
        }
        let free: Vec<Partition> = (0..self.partitions)
            .filter(|p| !g.owner.contains_key(p))
            .collect();
        if free.is_empty() {
            return;
        }
        let mut given: BTreeMap<MemberId, Vec<Partition>> = BTreeMap::new();
        let mut free = free.into_iter();
        for (i, &m) in members.iter().enumerate() {
            let has = keeps.get(&m).map_or(0, Vec::len);
            for _ in has..quota(i) as usize {
                let Some(p) = free.next() else {
                    break;
                };
                g.owner.insert(p, m);
                given.entry(m).or_default().push(p);
            }
        }
        if given.is_empty() {
            return;
        }
        g.generation += 1;
        let generation = g.generation;
        for (&m, member) in &g.members {
            let partitions = given.remove(&m).unwrap_or_default();
            self.world.note_at(
                member.node,
                "assign",
                [
                    m,
                    partitions.len() as u64,
                    u64::try_from(generation).unwrap_or(0),
                    g.number,
                ],
            );
            let _ = member.callbacks.send(Rebalance::Assign {
                partitions,
                generation: Some(generation),
            });
        }
    }

    /// The subscription group of a consumer group id.
    fn group_name(&self, id: &str) -> Option<GroupName> {
        GroupName::new(id.strip_prefix(&self.group_prefix)?).ok()
    }
}

/// The coordinator as the members of one mesh node reach it.
struct NodeCoordinator {
    coordinator: Arc<Coordinator>,
    node: usize,
}

impl SimCoordinator for NodeCoordinator {
    fn join(
        &self,
        group_id: &str,
        _client: &str,
        callbacks: UnboundedSender<Rebalance>,
    ) -> MemberId {
        let c = &self.coordinator;
        let mut st = c.lock();
        st.next_member += 1;
        let member = st.next_member;
        st.member_group.insert(member, group_id.to_owned());
        let number = c.group_name(group_id).map_or(0, |g| c.world.tag(&g));
        let g = st
            .groups
            .entry(group_id.to_owned())
            .or_insert_with(|| Group {
                number,
                ..Group::default()
            });
        g.members.insert(
            member,
            Member {
                node: self.node,
                callbacks,
                last_heartbeat: Instant::now(),
            },
        );
        let number = g.number;
        c.world
            .note_at(self.node, "member-joined", [member, 0, 0, number]);
        c.rebalance(&mut st, group_id);
        member
    }

    fn heartbeat_interval(&self) -> Duration {
        self.coordinator.timing.heartbeat
    }

    fn heartbeat(&self, member: MemberId) -> bool {
        let c = &self.coordinator;
        let mut st = c.lock();
        if st
            .deaf_until
            .get(&self.node)
            .is_some_and(|&until| Instant::now() < until && c.world.faults_on())
        {
            // Lost on the way: no news for either side.
            return true;
        }
        let Some(id) = st.member_group.get(&member).cloned() else {
            c.world
                .note_at(self.node, "heartbeat-refused", [member, 0, 0, 0]);
            return false;
        };
        match st
            .groups
            .get_mut(&id)
            .and_then(|g| g.members.get_mut(&member))
        {
            Some(m) => {
                m.last_heartbeat = Instant::now();
                true
            }
            None => false,
        }
    }

    fn revoked(&self, member: MemberId, partitions: &[Partition]) {
        let c = &self.coordinator;
        let mut st = c.lock();
        let Some(id) = st.member_group.get(&member).cloned() else {
            return;
        };
        let Some(g) = st.groups.get_mut(&id) else {
            return;
        };
        for p in partitions {
            if g.owner.get(p) == Some(&member) {
                g.owner.remove(p);
                g.revoking.remove(p);
            }
        }
        c.rebalance(&mut st, &id);
    }

    fn commit(
        &self,
        member: MemberId,
        generation: Option<i32>,
        offsets: &BTreeMap<Partition, Offset>,
    ) -> Result<(), String> {
        let c = &self.coordinator;
        let mut st = c.lock();
        let Some(id) = st.member_group.get(&member).cloned() else {
            c.world.count(|c| &mut c.commits_fenced);
            return Err(format!("UNKNOWN_MEMBER_ID: member {member}"));
        };
        let Some(g) = st.groups.get_mut(&id) else {
            return Err(format!("no group {id}"));
        };
        if generation != Some(g.generation) {
            c.world.count(|c| &mut c.commits_fenced);
            return Err(format!(
                "ILLEGAL_GENERATION: {generation:?}, the group is in {}",
                g.generation
            ));
        }
        for (&p, &o) in offsets {
            g.committed.insert(p, o);
        }
        let number = g.number;
        drop(st);
        c.world.note_at(
            self.node,
            "commit-taken",
            [member, offsets.len() as u64, 0, number],
        );
        if let Some(group) = c.group_name(&id) {
            for (&p, &o) in offsets {
                c.world.committed(self.node, &group, p, o);
            }
        }
        Ok(())
    }

    fn committed(&self, group_id: &str, partitions: &[Partition]) -> BTreeMap<Partition, Offset> {
        let st = self.coordinator.lock();
        let Some(g) = st.groups.get(group_id) else {
            return BTreeMap::new();
        };
        partitions
            .iter()
            .filter_map(|p| g.committed.get(p).map(|&o| (*p, o)))
            .collect()
    }

    fn leave(&self, member: MemberId) {
        let c = &self.coordinator;
        let mut st = c.lock();
        let Some(id) = st.member_group.get(&member).cloned() else {
            return;
        };
        c.remove(&mut st, &id, member, "member-left");
        c.rebalance(&mut st, &id);
    }
}
