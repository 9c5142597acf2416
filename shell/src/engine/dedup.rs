//! Publish deduplication (issue 22; DESIGN §5.1 and §8): an optional per-topic window in
//! which a repeated CloudEvents identity (`source`, `id`) is answered as accepted, with the
//! placement of the first, without being appended again.
//!
//! Two layers. [`Window`] is pure: one topic's remembered identities, bounded in entries
//! and in time; every call takes `now_ms` (wall clock, milliseconds) and nothing in it
//! reads a clock. [`Dedup`] is the shell's side: the windows of every topic behind one
//! lock, and the waiting of a publish whose event is being appended by another request
//! at that moment (it waits for that append to end, then is answered as a duplicate or,
//! if the append failed, appends itself).
//!
//! An identity is kept as the first 16 bytes of SHA-256 over the length-prefixed source
//! and id, so an entry's memory does not depend on what the publisher wrote (an `id` may
//! be as long as an event), and two different identities meet only by a SHA-256 collision.
//!
//! A window lives in memory. At start the engine refills it from the log's newest records
//! when the log can tell their append time ([`super::LogPort::recent_appends`]: the
//! embedded log can, the Kafka backend cannot — there the window starts empty).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use madsim_tokio as tokio;
use sha2::{Digest, Sha256};
use unimesh_core::{Offset, Partition, TopicName};

/// The longest window a topic may set: a week.
pub const MAX_WINDOW_MS: u64 = 7 * 24 * 3_600 * 1_000;
/// The most identities one topic's window may keep.
pub const MAX_ENTRIES: usize = 1_000_000;

/// A remembered CloudEvents identity (a digest of `source` and `id`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Identity([u8; 16]);

impl Identity {
    pub fn of(source: &str, id: &str) -> Self {
        let mut h = Sha256::new();
        h.update((source.len() as u64).to_be_bytes());
        h.update(source.as_bytes());
        h.update((id.len() as u64).to_be_bytes());
        h.update(id.as_bytes());
        let digest = h.finalize();
        let mut out = [0u8; 16];
        out.copy_from_slice(&digest[..16]);
        Identity(out)
    }
}

/// One topic's window: how long and how many.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowRule {
    /// How long an identity is remembered after its publish, in ms (> 0).
    pub window_ms: u64,
    /// The most identities remembered (≥ 1); the oldest go first.
    pub max_entries: usize,
}

/// The deduplication settings: a rule for every topic, and exceptions by name. Off
/// (`default` and `topics` empty) unless configured.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DedupConfig {
    /// The rule of every topic not named in `topics`; `None`: off for them.
    pub default: Option<WindowRule>,
    /// Per topic: its own rule, or `None` to turn it off for that topic.
    pub topics: BTreeMap<TopicName, Option<WindowRule>>,
}

impl DedupConfig {
    /// Whether any topic deduplicates.
    pub fn enabled(&self) -> bool {
        self.default.is_some() || self.topics.values().any(Option::is_some)
    }

    /// The rule of `topic`, if it deduplicates.
    pub fn rule(&self, topic: &TopicName) -> Option<WindowRule> {
        match self.topics.get(topic) {
            Some(rule) => *rule,
            None => self.default,
        }
    }
}

/// Where an event of a publish stands with the window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// New: reserved under this ticket; the caller appends it and settles the ticket.
    Fresh(u64),
    /// Published before, at this place; nothing to append.
    Duplicate(Partition, Offset),
    /// The same identity as the event at this earlier index of the same request.
    SameAs(usize),
}

/// Another request is appending one of these identities now; ask again once it settled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Busy;

#[derive(Clone, Copy, Debug)]
struct Entry {
    ticket: u64,
    expires_ms: u64,
    /// `None` while the request that reserved it is appending.
    placed: Option<(Partition, Offset)>,
}

/// One topic's remembered identities, oldest first. Bounded: at most `max_entries`
/// identities, none older than `window_ms`; the order queue holds at most twice that
/// (superseded places are dropped when it grows past).
#[derive(Debug)]
pub struct Window {
    rule: WindowRule,
    entries: HashMap<Identity, Entry>,
    /// (identity, ticket) in the order reserved; an element whose ticket is no longer the
    /// entry's is superseded and skipped.
    order: VecDeque<(Identity, u64)>,
    next_ticket: u64,
    /// The latest `now` seen: time never goes backwards in here (a wall clock may).
    now_ms: u64,
}

impl Window {
    pub fn new(rule: WindowRule) -> Self {
        Self {
            rule,
            entries: HashMap::new(),
            order: VecDeque::new(),
            next_ticket: 0,
            now_ms: 0,
        }
    }

    /// Identities remembered (pending ones included).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether `identity` is remembered as published (not pending, not expired) as of `now_ms`.
    pub fn placed(&mut self, now_ms: u64, identity: &Identity) -> Option<(Partition, Offset)> {
        self.evict(now_ms);
        self.entries.get(identity).and_then(|e| e.placed)
    }

    /// Plans a publish of `identities` (in request order): each is fresh (and reserved),
    /// a duplicate of an earlier publish, or the same as an earlier event of the request.
    /// `Err(Busy)` reserves nothing: one of them is pending for another request.
    pub fn plan(&mut self, now_ms: u64, identities: &[Identity]) -> Result<Vec<Slot>, Busy> {
        self.evict(now_ms);
        if identities
            .iter()
            .any(|i| matches!(self.entries.get(i), Some(e) if e.placed.is_none()))
        {
            return Err(Busy);
        }
        let mut first: HashMap<Identity, usize> = HashMap::with_capacity(identities.len());
        let mut slots = Vec::with_capacity(identities.len());
        for (index, identity) in identities.iter().enumerate() {
            if let Some(&earlier) = first.get(identity) {
                slots.push(Slot::SameAs(earlier));
                continue;
            }
            first.insert(*identity, index);
            match self.entries.get(identity).and_then(|e| e.placed) {
                Some((partition, offset)) => slots.push(Slot::Duplicate(partition, offset)),
                None => slots.push(Slot::Fresh(self.insert(*identity, None, self.now_ms))),
            }
        }
        self.evict(self.now_ms);
        Ok(slots)
    }

    /// The append of a reservation ended: remembered at `placed`, or (`None`: it failed)
    /// forgotten so a retry appends. A ticket no longer current (evicted) changes nothing.
    pub fn settle(
        &mut self,
        identity: &Identity,
        ticket: u64,
        placed: Option<(Partition, Offset)>,
    ) {
        let Some(entry) = self.entries.get_mut(identity) else {
            return;
        };
        if entry.ticket != ticket {
            return;
        }
        match placed {
            Some(p) => entry.placed = Some(p),
            None => {
                self.entries.remove(identity);
            }
        }
    }

    /// Remembers an identity found in the log at start, appended at `appended_ms`. Call in
    /// append-time order; what has already expired as of `now_ms` is skipped.
    pub fn restore(
        &mut self,
        now_ms: u64,
        identity: Identity,
        appended_ms: u64,
        placed: (Partition, Offset),
    ) {
        self.evict(now_ms);
        if appended_ms.saturating_add(self.rule.window_ms) <= self.now_ms {
            return;
        }
        self.insert(identity, Some(placed), appended_ms);
        self.evict(self.now_ms);
    }

    fn insert(
        &mut self,
        identity: Identity,
        placed: Option<(Partition, Offset)>,
        at_ms: u64,
    ) -> u64 {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.entries.insert(
            identity,
            Entry {
                ticket,
                expires_ms: at_ms.saturating_add(self.rule.window_ms),
                placed,
            },
        );
        self.order.push_back((identity, ticket));
        ticket
    }

    /// Drops what expired as of `now_ms` and the oldest beyond `max_entries`.
    fn evict(&mut self, now_ms: u64) {
        self.now_ms = self.now_ms.max(now_ms);
        while let Some(&(identity, ticket)) = self.order.front() {
            match self.entries.get(&identity) {
                Some(e) if e.ticket == ticket => {
                    if e.expires_ms > self.now_ms && self.entries.len() <= self.rule.max_entries {
                        break;
                    }
                    self.entries.remove(&identity);
                }
                // Superseded (forgotten after a failed append, or reserved again).
                _ => {}
            }
            self.order.pop_front();
        }
        if self.order.len() > self.rule.max_entries.saturating_mul(2) {
            let entries = &self.entries;
            self.order.retain(|(identity, ticket)| {
                entries.get(identity).is_some_and(|e| e.ticket == *ticket)
            });
        }
    }
}

/// The windows of every deduplicating topic, shared by every publish.
#[derive(Debug)]
pub struct Dedup {
    config: DedupConfig,
    windows: Mutex<HashMap<TopicName, Window>>,
    /// Woken whenever a reservation is settled, for the requests waiting on [`Busy`].
    settled: tokio::sync::Notify,
}

/// The reservations of one request, forgotten on drop unless settled (a request dropped
/// mid-append, or failed: a retry must append).
pub struct Reserved {
    dedup: Arc<Dedup>,
    topic: TopicName,
    tickets: Vec<(Identity, u64)>,
}

impl Dedup {
    /// `None` when no topic deduplicates: the publish path then never looks here.
    pub fn new(config: DedupConfig) -> Option<Arc<Self>> {
        config.enabled().then(|| {
            Arc::new(Self {
                config,
                windows: Mutex::new(HashMap::new()),
                settled: tokio::sync::Notify::new(),
            })
        })
    }

    pub fn config(&self) -> &DedupConfig {
        &self.config
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<TopicName, Window>> {
        self.windows.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Plans a publish of `identities` to `topic` (which must deduplicate), waiting while
    /// another request appends one of them. The fresh ones come back reserved.
    pub async fn plan(
        self: &Arc<Self>,
        topic: &TopicName,
        rule: WindowRule,
        identities: &[Identity],
        now_ms: impl Fn() -> u64,
    ) -> (Vec<Slot>, Reserved) {
        loop {
            let notified = self.settled.notified();
            tokio::pin!(notified);
            {
                let mut windows = self.lock();
                let window = windows
                    .entry(topic.clone())
                    .or_insert_with(|| Window::new(rule));
                match window.plan(now_ms(), identities) {
                    Ok(slots) => {
                        let tickets = slots
                            .iter()
                            .zip(identities)
                            .filter_map(|(slot, identity)| match slot {
                                Slot::Fresh(ticket) => Some((*identity, *ticket)),
                                _ => None,
                            })
                            .collect();
                        let reserved = Reserved {
                            dedup: self.clone(),
                            topic: topic.clone(),
                            tickets,
                        };
                        return (slots, reserved);
                    }
                    Err(Busy) => {
                        // Registered before the lock is let go: a settle in between wakes it.
                        notified.as_mut().enable();
                    }
                }
            }
            notified.await;
        }
    }

    /// Refills `topic`'s window from records found in the log (append ms, identity, place),
    /// in any order.
    pub fn restore(
        &self,
        topic: &TopicName,
        now_ms: u64,
        mut found: Vec<(u64, Identity, (Partition, Offset))>,
    ) -> usize {
        let Some(rule) = self.config.rule(topic) else {
            return 0;
        };
        found.sort_by_key(|(at, _, place)| (*at, *place));
        let mut windows = self.lock();
        let window = windows
            .entry(topic.clone())
            .or_insert_with(|| Window::new(rule));
        for (at, identity, place) in found {
            window.restore(now_ms, identity, at, place);
        }
        let kept = window.len();
        if kept == 0 {
            windows.remove(topic);
        }
        kept
    }

    fn settle(
        &self,
        topic: &TopicName,
        tickets: &[(Identity, u64)],
        placed: Option<&[(Partition, Offset)]>,
    ) {
        {
            let mut windows = self.lock();
            if let Some(window) = windows.get_mut(topic) {
                for (i, (identity, ticket)) in tickets.iter().enumerate() {
                    window.settle(identity, *ticket, placed.and_then(|p| p.get(i).copied()));
                }
                // A topic whose only publish failed (over the topic limit, say) leaves no
                // window behind: windows stay bounded by the topics the log holds.
                if window.is_empty() {
                    windows.remove(topic);
                }
            }
        }
        self.settled.notify_waiters();
    }
}

impl Reserved {
    /// The fresh events were appended at `placed` (one per reservation, in order).
    pub fn appended(mut self, placed: &[(Partition, Offset)]) {
        let tickets = std::mem::take(&mut self.tickets);
        self.dedup.settle(&self.topic, &tickets, Some(placed));
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        if !self.tickets.is_empty() {
            let tickets = std::mem::take(&mut self.tickets);
            self.dedup.settle(&self.topic, &tickets, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use madsim_tokio as tokio;

    use super::{Busy, Dedup, DedupConfig, Identity, Offset, Slot, TopicName, Window, WindowRule};

    fn id(n: u32) -> Identity {
        Identity::of("/src", &format!("e{n}"))
    }

    fn rule(window_ms: u64, max_entries: usize) -> WindowRule {
        WindowRule {
            window_ms,
            max_entries,
        }
    }

    /// Plans one identity and settles it at `offset`.
    fn publish(w: &mut Window, now: u64, i: Identity, offset: Offset) -> Slot {
        let slots = w.plan(now, &[i]).unwrap();
        if let Slot::Fresh(ticket) = slots[0] {
            w.settle(&i, ticket, Some((0, offset)));
        }
        slots[0]
    }

    #[test]
    fn identity_is_source_and_id_unambiguously() {
        assert_eq!(Identity::of("/a", "1"), Identity::of("/a", "1"));
        assert_ne!(Identity::of("/a", "1"), Identity::of("/b", "1"));
        assert_ne!(Identity::of("/a", "1"), Identity::of("/a", "2"));
        // The length prefix keeps the boundary: "ab"+"c" is not "a"+"bc".
        assert_ne!(Identity::of("ab", "c"), Identity::of("a", "bc"));
    }

    #[test]
    fn a_repeat_within_the_window_is_a_duplicate_of_the_first_place() {
        let mut w = Window::new(rule(1_000, 10));
        assert!(matches!(publish(&mut w, 100, id(1), 7), Slot::Fresh(_)));
        assert_eq!(publish(&mut w, 500, id(1), 99), Slot::Duplicate(0, 7));
        assert_eq!(publish(&mut w, 1_099, id(1), 99), Slot::Duplicate(0, 7));
    }

    #[test]
    fn a_repeat_after_the_window_is_fresh() {
        let mut w = Window::new(rule(1_000, 10));
        publish(&mut w, 100, id(1), 7);
        // Expires at 100 + 1000: at 1100 it is gone.
        assert!(matches!(publish(&mut w, 1_100, id(1), 8), Slot::Fresh(_)));
        assert_eq!(publish(&mut w, 1_200, id(1), 9), Slot::Duplicate(0, 8));
    }

    #[test]
    fn the_oldest_go_first_beyond_max_entries() {
        let mut w = Window::new(rule(1_000_000, 3));
        for n in 0..5 {
            publish(&mut w, 10 + u64::from(n), id(n), u64::from(n));
        }
        assert_eq!(w.len(), 3);
        assert_eq!(w.placed(20, &id(0)), None);
        assert_eq!(w.placed(20, &id(1)), None);
        assert_eq!(w.placed(20, &id(2)), Some((0, 2)));
        assert_eq!(w.placed(20, &id(4)), Some((0, 4)));
    }

    #[test]
    fn time_going_backwards_neither_revives_nor_keeps_longer() {
        let mut w = Window::new(rule(1_000, 10));
        publish(&mut w, 5_000, id(1), 1);
        assert_eq!(w.placed(6_000, &id(1)), None);
        // The wall clock stepped back: what expired stays expired.
        assert_eq!(w.placed(5_500, &id(1)), None);
        // And a new entry is stamped with the latest time seen, not the earlier one.
        publish(&mut w, 5_500, id(2), 2);
        assert_eq!(w.placed(6_999, &id(2)), Some((0, 2)));
        assert_eq!(w.placed(7_000, &id(2)), None);
    }

    #[test]
    fn a_request_plans_its_own_repeats_as_the_first() {
        let mut w = Window::new(rule(1_000, 10));
        publish(&mut w, 0, id(9), 3);
        let slots = w.plan(10, &[id(1), id(2), id(1), id(9), id(9)]).unwrap();
        assert!(matches!(slots[0], Slot::Fresh(_)));
        assert!(matches!(slots[1], Slot::Fresh(_)));
        assert_eq!(slots[2], Slot::SameAs(0));
        assert_eq!(slots[3], Slot::Duplicate(0, 3));
        assert_eq!(slots[4], Slot::SameAs(3));
    }

    #[test]
    fn a_pending_identity_makes_another_request_wait_and_reserve_nothing() {
        let mut w = Window::new(rule(1_000, 10));
        let slots = w.plan(0, &[id(1)]).unwrap();
        let Slot::Fresh(ticket) = slots[0] else {
            panic!("fresh expected, got {slots:?}");
        };
        assert_eq!(w.plan(1, &[id(2), id(1)]), Err(Busy));
        assert_eq!(w.len(), 1, "the busy plan reserved id 2 nonetheless");
        w.settle(&id(1), ticket, Some((1, 4)));
        let again = w.plan(2, &[id(2), id(1)]).unwrap();
        assert!(matches!(again[0], Slot::Fresh(_)));
        assert_eq!(again[1], Slot::Duplicate(1, 4));
    }

    #[test]
    fn a_failed_append_is_forgotten_so_a_retry_appends() {
        let mut w = Window::new(rule(1_000, 10));
        let Slot::Fresh(ticket) = w.plan(0, &[id(1)]).unwrap()[0] else {
            panic!("fresh expected");
        };
        w.settle(&id(1), ticket, None);
        assert!(w.is_empty());
        assert!(matches!(w.plan(1, &[id(1)]).unwrap()[0], Slot::Fresh(_)));
    }

    #[test]
    fn a_stale_ticket_changes_nothing() {
        let mut w = Window::new(rule(100, 10));
        let Slot::Fresh(old) = w.plan(0, &[id(1)]).unwrap()[0] else {
            panic!("fresh expected");
        };
        // The pending reservation expired; a new request reserved the identity again.
        let Slot::Fresh(new) = w.plan(200, &[id(1)]).unwrap()[0] else {
            panic!("fresh expected");
        };
        assert_ne!(old, new);
        w.settle(&id(1), old, None);
        assert_eq!(
            w.len(),
            1,
            "the old ticket's failure forgot the new reservation"
        );
        w.settle(&id(1), new, Some((0, 5)));
        assert_eq!(w.placed(201, &id(1)), Some((0, 5)));
    }

    #[test]
    fn the_order_queue_stays_bounded_when_appends_keep_failing() {
        let mut w = Window::new(rule(1_000_000, 4));
        // One long-lived entry at the front keeps expiry from popping what follows.
        publish(&mut w, 0, id(0), 0);
        for n in 1..1_000 {
            let Slot::Fresh(ticket) = w.plan(n, &[id(n as u32)]).unwrap()[0] else {
                panic!("fresh expected");
            };
            w.settle(&id(n as u32), ticket, None);
        }
        assert!(w.order.len() <= 8, "order queue grew to {}", w.order.len());
        assert_eq!(w.placed(1_000, &id(0)), Some((0, 0)));
    }

    #[test]
    fn restore_keeps_the_unexpired_newest() {
        let mut w = Window::new(rule(1_000, 2));
        w.restore(5_000, id(1), 3_000, (0, 1)); // expired at 4000
        w.restore(5_000, id(2), 4_500, (0, 2));
        w.restore(5_000, id(3), 4_600, (1, 0));
        w.restore(5_000, id(4), 4_700, (0, 3));
        assert_eq!(w.len(), 2);
        assert_eq!(w.placed(5_000, &id(1)), None);
        assert_eq!(w.placed(5_000, &id(2)), None, "beyond max_entries");
        assert_eq!(w.placed(5_000, &id(3)), Some((1, 0)));
        // Restored entries expire by their append time, not the time of the restart.
        assert_eq!(w.placed(5_699, &id(4)), Some((0, 3)));
        assert_eq!(w.placed(5_700, &id(4)), None);
    }

    #[test]
    fn config_picks_the_topic_rule_over_the_default() {
        let t = |s: &str| TopicName::new(s).unwrap();
        let mut c = DedupConfig::default();
        assert!(!c.enabled());
        c.topics.insert(t("orders"), Some(rule(5, 5)));
        assert!(c.enabled());
        assert_eq!(c.rule(&t("orders")), Some(rule(5, 5)));
        assert_eq!(c.rule(&t("other")), None);
        c.default = Some(rule(9, 9));
        c.topics.insert(t("noisy"), None);
        assert_eq!(c.rule(&t("other")), Some(rule(9, 9)));
        assert_eq!(c.rule(&t("noisy")), None);
    }

    /// Every topic deduplicating for a minute; topic `t`.
    fn shared() -> (std::sync::Arc<Dedup>, TopicName, WindowRule) {
        let rule = rule(60_000, 100);
        let config = DedupConfig {
            default: Some(rule),
            ..DedupConfig::default()
        };
        let dedup = Dedup::new(config).unwrap();
        (dedup, TopicName::new("t").unwrap(), rule)
    }

    #[tokio::test]
    async fn a_concurrent_repeat_waits_for_the_first_append() {
        let (dedup, topic, rule) = shared();
        let (slots, first) = dedup.plan(&topic, rule, &[id(1)], || 0).await;
        assert!(matches!(slots[0], Slot::Fresh(_)));
        let second = {
            let (dedup, topic) = (dedup.clone(), topic.clone());
            tokio::spawn(async move { dedup.plan(&topic, rule, &[id(1)], || 1).await.0 })
        };
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(
            !second.is_finished(),
            "the repeat did not wait for the pending append"
        );
        first.appended(&[(2, 11)]);
        assert_eq!(second.await.unwrap(), vec![Slot::Duplicate(2, 11)]);
    }

    #[tokio::test]
    async fn a_dropped_reservation_lets_the_waiting_repeat_append() {
        let (dedup, topic, rule) = shared();
        let (_, first) = dedup.plan(&topic, rule, &[id(1)], || 0).await;
        let second = {
            let (dedup, topic) = (dedup.clone(), topic.clone());
            tokio::spawn(async move {
                let (slots, reserved) = dedup.plan(&topic, rule, &[id(1)], || 1).await;
                reserved.appended(&[(0, 1)]);
                slots
            })
        };
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        drop(first);
        assert!(matches!(second.await.unwrap()[0], Slot::Fresh(_)));
    }
}
