//! A way round a group coordinator whose rebalance never ends (issue 18, DESIGN §8).
//!
//! tansu 0.6.0 (and nisshi, its later name, at 939be10) keeps a dead member as a forming
//! group's leader: when the killed instance led the group, a survivor's heartbeat evicts it
//! in the formed group without clearing the leader (`Inner<Formed>::heartbeat` calls the
//! member-level `missed_heartbeat`, not the group-level one that would move the group to
//! forming with no leader), the survivor's rejoin makes the group forming with that leader,
//! and every SyncGroup is answered "rebalance in progress" from then on. The survivor never
//! takes the dead one's partitions, and with a short session it loses its own too.
//!
//! What clears the leader there is a reload of the group from the broker's store
//! (`Wrapper::with_storage_group_detail` drops a leader that is not a member). The
//! coordinator reloads when an update finds the stored group newer than its cached copy,
//! and it takes the cached copy out while it serves a request — for 3 s when it pauses a
//! follower's JoinGroup. So a group request on another connection during that pause finds
//! no cached copy, fails its conditional write, reloads (leader cleared) and is stored; the
//! paused JoinGroup then finds itself outdated, reloads too, and its member becomes leader.
//! Shown with plain confluent-kafka consumers (`tests/python/takeover_probe.py`,
//! `LEADER_DIES`, `NUDGE`): 3 of 3 runs stuck without, 3 of 3 taken over 12.1 s after the
//! kill with.
//!
//! So each group consumer reports its `join_state` through librdkafka's statistics (one a
//! second); while it waits on the broker ([`WAITING_ON_BROKER`]) for longer than
//! [`stuck_after`] without being steady in between, a second client with the same
//! `group.id`, never subscribed, commits offset 0 of partition 0 of [`NUDGE_TOPIC`] (a
//! topic that does not exist) once a second until the consumer is steady again. Only the
//! request matters: tansu refuses the commit (unknown topic), Apache Kafka refuses a
//! member-less commit to a group with members, and a broker that took it would hold an
//! offset of a topic no one reads. On a broker without the fault a long rebalance costs a
//! request a second and nothing else; counted in `unimesh_kafka_group_nudges_total`.

use std::time::{Duration, Instant};

/// The topic the nudge commits to: a name no one creates (the `__` prefix is the broker's
/// own, and no broker has this one), so no real offset is ever written.
pub(super) const NUDGE_TOPIC: &str = "__unimesh_group_nudge";

/// The librdkafka join states in which the consumer waits on the broker (the others are
/// steady, or wait on the application's rebalance callback).
pub(super) const WAITING_ON_BROKER: &[&str] = &["init", "wait-join", "wait-metadata", "wait-sync"];

/// How often librdkafka reports a group consumer's statistics.
pub(super) const STATS_INTERVAL_MS: u32 = 1_000;

/// How long a rebalance may wait on the broker before it is taken as stuck: half the
/// session (librdkafka sends no heartbeat while it joins, so a member waiting a whole
/// session is evicted; half leaves time to nudge first), at least 3 s (tansu's own pause
/// for a follower's JoinGroup) and at most 10 s.
pub(super) fn stuck_after(session: Duration) -> Duration {
    (session / 2).clamp(Duration::from_secs(3), Duration::from_secs(10))
}

/// Whether a group consumer's rebalance is stuck, from its join states over time (no
/// clock of its own: every observation brings `now`).
#[derive(Debug)]
pub(super) struct StuckWatch {
    stuck_after: Duration,
    /// Since when the consumer has waited on the broker without being steady.
    waiting_since: Option<Instant>,
    last_nudge: Option<Instant>,
    /// Nudges in the current wait.
    nudges: u32,
}

/// What one observation asks for.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Nothing to do.
    Wait,
    /// Send a nudge; `first` when it is the first of this wait.
    Nudge { first: bool, waited: Duration },
    /// The wait that was nudged ended after `nudges` nudges: the nudging client can go.
    Settled { nudges: u32 },
}

impl StuckWatch {
    pub fn new(stuck_after: Duration) -> Self {
        Self {
            stuck_after,
            waiting_since: None,
            last_nudge: None,
            nudges: 0,
        }
    }

    /// One statistics report: the consumer's `join_state` at `now`.
    pub fn observe(&mut self, join_state: &str, now: Instant) -> Verdict {
        if !WAITING_ON_BROKER.contains(&join_state) {
            self.waiting_since = None;
            self.last_nudge = None;
            let nudges = std::mem::take(&mut self.nudges);
            return if nudges > 0 {
                Verdict::Settled { nudges }
            } else {
                Verdict::Wait
            };
        }
        let since = *self.waiting_since.get_or_insert(now);
        let waited = now.saturating_duration_since(since);
        let due = waited >= self.stuck_after
            && self
                .last_nudge
                .is_none_or(|t| now.saturating_duration_since(t) >= Duration::from_secs(1));
        if !due {
            return Verdict::Wait;
        }
        self.last_nudge = Some(now);
        self.nudges += 1;
        Verdict::Nudge {
            first: self.nudges == 1,
            waited,
        }
    }
}

/// The `join_state` of a group consumer's statistics report (librdkafka's JSON), if it has
/// a group.
pub(super) fn join_state(stats: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Stats {
        cgrp: Option<Cgrp>,
    }
    #[derive(serde::Deserialize)]
    struct Cgrp {
        join_state: String,
    }
    serde_json::from_slice::<Stats>(stats)
        .ok()?
        .cgrp
        .map(|c| c.join_state)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a nudge comes only after the consumer has waited on the broker for the
    /// threshold without a steady state in between, then once a second, and a steady state
    /// (or the application's callback) ends the wait and reports how many were sent.
    /// Method: a scripted sequence of join states and times.
    #[test]
    fn a_rebalance_waiting_on_the_broker_past_the_threshold_is_nudged_once_a_second() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut w = StuckWatch::new(Duration::from_secs(3));
        assert_eq!(w.observe("steady", at(0)), Verdict::Wait);
        assert_eq!(w.observe("wait-join", at(1_000)), Verdict::Wait);
        assert_eq!(w.observe("wait-sync", at(3_000)), Verdict::Wait);
        // Steady in between: the wait starts again.
        assert_eq!(w.observe("steady", at(3_500)), Verdict::Wait);
        assert_eq!(w.observe("init", at(4_000)), Verdict::Wait);
        assert_eq!(w.observe("wait-join", at(6_999)), Verdict::Wait);
        assert_eq!(
            w.observe("wait-sync", at(7_000)),
            Verdict::Nudge {
                first: true,
                waited: Duration::from_secs(3)
            }
        );
        assert_eq!(w.observe("init", at(7_500)), Verdict::Wait);
        assert_eq!(
            w.observe("wait-join", at(8_000)),
            Verdict::Nudge {
                first: false,
                waited: Duration::from_secs(4)
            }
        );
        // The application's callback is not the broker's wait.
        assert_eq!(
            w.observe("wait-assign-call", at(9_000)),
            Verdict::Settled { nudges: 2 }
        );
        assert_eq!(w.observe("steady", at(9_500)), Verdict::Wait);
        assert_eq!(w.observe("wait-join", at(10_000)), Verdict::Wait);
    }

    /// Goal: the threshold is half the session within [3 s, 10 s]. Method: librdkafka's
    /// default session (45 s), a short one (6 s) and a tiny one.
    #[test]
    fn the_threshold_is_half_a_session_between_three_and_ten_seconds() {
        assert_eq!(
            stuck_after(Duration::from_secs(45)),
            Duration::from_secs(10)
        );
        assert_eq!(stuck_after(Duration::from_secs(6)), Duration::from_secs(3));
        assert_eq!(stuck_after(Duration::from_secs(10)), Duration::from_secs(5));
        assert_eq!(stuck_after(Duration::from_secs(1)), Duration::from_secs(3));
    }

    /// Goal: the join state is read from librdkafka's statistics JSON, and a report without
    /// a group (or not JSON) gives none. Method: trimmed reports in librdkafka's shape.
    #[test]
    fn the_join_state_is_read_from_the_statistics() {
        let with = br#"{"name":"c#consumer-1","type":"consumer","brokers":{},
            "cgrp":{"state":"up","stateage":1200,"join_state":"wait-sync","rebalance_age":3,
            "rebalance_cnt":2,"assignment_size":4}}"#;
        assert_eq!(join_state(with).as_deref(), Some("wait-sync"));
        assert_eq!(join_state(br#"{"name":"p","type":"producer"}"#), None);
        assert_eq!(join_state(b"not json"), None);
    }
}
