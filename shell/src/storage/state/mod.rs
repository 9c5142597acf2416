//! State stores: what the mesh must find again after a restart — the epoch, the durable
//! subscription groups, the per-lane checkpoints (watermark, ACK ranges, attempt numbers),
//! the DLQ ledger and the per-topic rate-limit rules.
//!
//! The core emits `Effect::Persist { ticket, batch }`; the engine hands the batch to
//! [`StateStore::apply`], which makes it durable as one unit, and only then reports
//! `Persisted` to the core. At start the engine calls [`StateStore::load`] to build the core's
//! `Recovered`.
//!
//! Three backends share one key layout (`keys`), one value format (`codec`) and one
//! translation of batches into writes (this file): [`RocksStore`] (the default),
//! [`SledStore`] (pure Rust) and [`MemoryStore`] (tests and simulation; its "disk" survives
//! a reopen). Each backend only has to provide ordered reads and an atomic, durable commit
//! of a list of writes (the `Kv` port).

use std::collections::BTreeMap;

use bytes::Bytes;
use unimesh_core::{DlqKey, Epoch, GroupName, PersistBatch, RateRule, Recovered, TopicName};

pub(crate) mod codec;
mod keys;
mod memory;
mod port;
#[cfg(feature = "rocksdb")]
mod rocks;
#[cfg(feature = "sled")]
mod sled_store;

// The contract suite runs on every backend, so it needs them all.
#[cfg(all(test, feature = "rocksdb", feature = "sled"))]
mod contract;

pub use memory::{MemoryDisk, MemoryStore};
pub use port::StoreAdapter;
#[cfg(feature = "rocksdb")]
pub use rocks::RocksStore;
#[cfg(feature = "sled")]
pub use sled_store::SledStore;

/// The durable state of one mesh instance.
///
/// `apply` is the only way the delivery state changes; it is all or nothing and durable
/// when it returns `Ok`. Reads see every batch that returned `Ok`.
pub trait StateStore: Send + 'static {
    /// Everything a restart needs. A corrupt value is an error naming its key, never a
    /// panic and never silently skipped.
    fn load(&self) -> Result<Loaded, StoreError>;

    /// Applies the batch atomically (all or nothing) and durably (synced before it
    /// returns), in the order removed groups (their subscription, checkpoints and DLQ
    /// entries), subscriptions (upsert), checkpoints (replace), dead letters (upsert by
    /// (group, partition, offset), stamped `now_wall_ms`), DLQ resolutions (delete), epoch.
    /// An epoch lower than the stored one is refused ([`StoreError::EpochRegression`]):
    /// delivery ids are only unique if epochs never repeat.
    fn apply(&mut self, batch: &PersistBatch, now_wall_ms: u64) -> Result<(), StoreError>;

    /// Up to `max` DLQ entries of `group` ordered by (partition, offset), starting after
    /// `after` (the last key of the previous page) when given.
    fn dlq_list(
        &self,
        group: &GroupName,
        after: Option<&DlqKey>,
        max: usize,
    ) -> Result<Vec<DlqEntry>, StoreError>;

    /// How many DLQ entries `group` has. Walks the group's keys (not their values): the
    /// ledger is an operator's view, not a hot path.
    fn dlq_count(&self, group: &GroupName) -> Result<u64, StoreError>;

    /// Sets (`Some`) or removes (`None`) the rate-limit rule of a topic, durably.
    fn put_rate_rule(
        &mut self,
        topic: &TopicName,
        rule: Option<RateRule>,
    ) -> Result<(), StoreError>;
}

/// What [`StateStore::load`] found.
#[derive(Clone, Debug, Default)]
pub struct Loaded {
    /// Epoch, subscriptions (ordered by group name) and checkpoints (ordered by group,
    /// partition), ready for `Mesh::new`.
    pub recovered: Recovered,
    /// Rate-limit rules, ordered by topic.
    pub rate_rules: Vec<(TopicName, RateRule)>,
    /// The subscriptions come from a store other instances write too (Kafka's
    /// subscriptions topic), each under its own configuration: the engine skips, logged,
    /// a definition this node's limits refuse (as the watcher does, `engine::shared`)
    /// instead of refusing to start. False: this node wrote every one of them.
    pub shared_definitions: bool,
}

/// One dead-lettered record of one group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DlqEntry {
    pub key: DlqKey,
    pub topic: TopicName,
    /// The record's stored bytes, as the broker returned them.
    pub body: Bytes,
    /// Attempts made before it was dead-lettered.
    pub attempts: u32,
    /// Why (`ack-timeout`, `nacked`, `client-gone`, `undecodable: ...`).
    pub reason: String,
    /// Wall-clock time of the `apply` that wrote it, in milliseconds since the Unix epoch.
    pub dead_lettered_at_ms: u64,
}

/// Why a store operation failed. Variants in alphabetical order.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A stored value or key does not decode. `key` is human-readable
    /// (`checkpoint/orders/3`, `dlq/orders/3/1200`, `subscription/orders`, `epoch`).
    #[error("corrupt state at {key}: {why}")]
    Corrupt { key: String, why: String },
    /// A DLQ cursor of another group was passed to `dlq_list`.
    #[error("DLQ cursor belongs to group {cursor_group}, not {group}")]
    CursorGroupMismatch {
        group: GroupName,
        cursor_group: GroupName,
    },
    /// Something in the batch cannot be represented; nothing was written.
    #[error("cannot store {what}: {why}")]
    Encode { what: &'static str, why: String },
    /// The batch would lower the stored epoch; nothing was written.
    #[error("epoch {requested} is below the stored epoch {stored}; refusing to go back")]
    EpochRegression { stored: Epoch, requested: Epoch },
    /// The backend failed to read, write or sync (disk, lock, engine error).
    #[error("{backend} store failed to {op}: {message}")]
    Io {
        backend: &'static str,
        op: &'static str,
        message: String,
    },
}

/// One write of an atomic commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Put {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    Delete {
        key: Vec<u8>,
    },
    /// Every key in `[start, end)`.
    DeleteRange {
        start: Vec<u8>,
        end: Vec<u8>,
    },
}

/// Whether a scan goes on after an entry.
pub(crate) enum Flow {
    Continue,
    Stop,
}

/// Called for each entry of a scan, with its key and value.
pub(crate) type Visitor<'a> = dyn FnMut(&[u8], &[u8]) -> Result<Flow, StoreError> + 'a;

/// Lists the stored keys in `[start, end)`.
pub(crate) type KeysIn<'a> = dyn FnMut(&[u8], &[u8]) -> Result<Vec<Vec<u8>>, StoreError> + 'a;

/// Key -> new value, or `None` for a deletion.
pub(crate) type NetWrites = BTreeMap<Vec<u8>, Option<Vec<u8>>>;

/// The port a backend implements: ordered reads and one atomic, durable commit.
pub(crate) trait Kv {
    fn kv_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;

    /// Visits the entries with keys in `[start, end)` in ascending key order.
    fn kv_scan(&self, start: &[u8], end: &[u8], visit: &mut Visitor<'_>) -> Result<(), StoreError>;

    /// Applies `ops` in order as one atomic unit, durable (synced) before returning `Ok`.
    /// On `Err` none of them may be visible, now or after a restart.
    fn kv_commit(&mut self, ops: &[Op]) -> Result<(), StoreError>;
}

/// Turns a batch into the writes of one commit. Everything that can fail (reading the
/// epoch, encoding) happens here, before anything is written, so a refused batch leaves
/// no trace.
fn batch_ops(kv: &impl Kv, batch: &PersistBatch, now_wall_ms: u64) -> Result<Vec<Op>, StoreError> {
    let mut ops = Vec::with_capacity(
        batch.removed_groups.len() * 3
            + batch.subscriptions.len()
            + batch.checkpoints.len()
            + batch.dead_letters.len()
            + batch.dlq_resolved.len()
            + 1,
    );
    if let Some(requested) = batch.epoch {
        let stored = read_epoch(kv)?;
        if requested < stored {
            return Err(StoreError::EpochRegression { stored, requested });
        }
    }
    for group in &batch.removed_groups {
        ops.push(Op::Delete {
            key: keys::subscription(group),
        });
        for r in [keys::group_checkpoints(group), keys::group_dlq(group)] {
            ops.push(Op::DeleteRange {
                start: r.start,
                end: r.end,
            });
        }
    }
    for spec in &batch.subscriptions {
        ops.push(Op::Put {
            key: keys::subscription(&spec.group),
            value: codec::encode_subscription(spec)?,
        });
    }
    for lane in &batch.checkpoints {
        ops.push(Op::Put {
            key: keys::checkpoint(&lane.group, lane.partition),
            value: lane.checkpoint.encode(),
        });
    }
    for d in &batch.dead_letters {
        ops.push(Op::Put {
            key: keys::dlq(&d.key),
            value: codec::encode_dead_letter(d, now_wall_ms)?,
        });
    }
    for k in &batch.dlq_resolved {
        ops.push(Op::Delete { key: keys::dlq(k) });
    }
    if let Some(epoch) = batch.epoch {
        ops.push(Op::Put {
            key: keys::EPOCH.to_vec(),
            value: codec::encode_epoch(epoch),
        });
    }
    Ok(ops)
}

fn read_epoch(kv: &impl Kv) -> Result<Epoch, StoreError> {
    match kv.kv_get(keys::EPOCH)? {
        None => Ok(0),
        Some(v) => codec::decode_epoch("epoch", &v),
    }
}

fn apply(kv: &mut impl Kv, batch: &PersistBatch, now_wall_ms: u64) -> Result<(), StoreError> {
    if batch.is_empty() {
        return Ok(());
    }
    let ops = batch_ops(kv, batch, now_wall_ms)?;
    kv.kv_commit(&ops)
}

fn load(kv: &impl Kv) -> Result<Loaded, StoreError> {
    let mut loaded = Loaded::default();
    loaded.recovered.epoch = read_epoch(kv)?;
    let r = keys::subscriptions();
    kv.kv_scan(&r.start, &r.end, &mut |k, v| {
        let group = keys::parse_subscription(k)?;
        let spec = codec::decode_subscription(&keys::describe(k), &group, v)?;
        loaded.recovered.subscriptions.push(spec);
        Ok(Flow::Continue)
    })?;
    let r = keys::checkpoints();
    kv.kv_scan(&r.start, &r.end, &mut |k, v| {
        let (group, partition) = keys::parse_checkpoint(k)?;
        let checkpoint = unimesh_core::Checkpoint::decode(v).map_err(|e| StoreError::Corrupt {
            key: keys::describe(k),
            why: e.to_string(),
        })?;
        loaded
            .recovered
            .checkpoints
            .push((group, partition, checkpoint));
        Ok(Flow::Continue)
    })?;
    let r = keys::rate_rules();
    kv.kv_scan(&r.start, &r.end, &mut |k, v| {
        let topic = keys::parse_rate_rule(k)?;
        let rule = codec::decode_rate_rule(&keys::describe(k), v)?;
        loaded.rate_rules.push((topic, rule));
        Ok(Flow::Continue)
    })?;
    Ok(loaded)
}

fn dlq_list(
    kv: &impl Kv,
    group: &GroupName,
    after: Option<&DlqKey>,
    max: usize,
) -> Result<Vec<DlqEntry>, StoreError> {
    let range = keys::group_dlq(group);
    let start = match after {
        None => range.start,
        Some(cursor) if cursor.group != *group => {
            return Err(StoreError::CursorGroupMismatch {
                group: group.clone(),
                cursor_group: cursor.group.clone(),
            })
        }
        Some(cursor) => {
            // DLQ keys of one group all have the same length, so the cursor key followed
            // by a zero byte sorts after it and before the next entry.
            let mut k = keys::dlq(cursor);
            k.push(0);
            k
        }
    };
    let mut out = Vec::new();
    if max == 0 {
        return Ok(out);
    }
    kv.kv_scan(&start, &range.end, &mut |k, v| {
        let key = keys::parse_dlq(k)?;
        out.push(codec::decode_dead_letter(&keys::describe(k), key, v)?);
        Ok(if out.len() >= max {
            Flow::Stop
        } else {
            Flow::Continue
        })
    })?;
    Ok(out)
}

fn dlq_count(kv: &impl Kv, group: &GroupName) -> Result<u64, StoreError> {
    let r = keys::group_dlq(group);
    let mut n = 0u64;
    kv.kv_scan(&r.start, &r.end, &mut |_, _| {
        n += 1;
        Ok(Flow::Continue)
    })?;
    Ok(n)
}

fn put_rate_rule(
    kv: &mut impl Kv,
    topic: &TopicName,
    rule: Option<RateRule>,
) -> Result<(), StoreError> {
    let key = keys::rate_rule(topic);
    let op = match rule {
        Some(rule) => Op::Put {
            key,
            value: codec::encode_rate_rule(&rule),
        },
        None => Op::Delete { key },
    };
    kv.kv_commit(&[op])
}

/// Implements [`StateStore`] for a backend through the shared translation above.
macro_rules! state_store_via_kv {
    ($ty:ty) => {
        impl $crate::storage::state::StateStore for $ty {
            fn load(
                &self,
            ) -> Result<$crate::storage::state::Loaded, $crate::storage::state::StoreError> {
                $crate::storage::state::load(self)
            }

            fn apply(
                &mut self,
                batch: &unimesh_core::PersistBatch,
                now_wall_ms: u64,
            ) -> Result<(), $crate::storage::state::StoreError> {
                $crate::storage::state::apply(self, batch, now_wall_ms)
            }

            fn dlq_list(
                &self,
                group: &unimesh_core::GroupName,
                after: Option<&unimesh_core::DlqKey>,
                max: usize,
            ) -> Result<Vec<$crate::storage::state::DlqEntry>, $crate::storage::state::StoreError>
            {
                $crate::storage::state::dlq_list(self, group, after, max)
            }

            fn dlq_count(
                &self,
                group: &unimesh_core::GroupName,
            ) -> Result<u64, $crate::storage::state::StoreError> {
                $crate::storage::state::dlq_count(self, group)
            }

            fn put_rate_rule(
                &mut self,
                topic: &unimesh_core::TopicName,
                rule: Option<unimesh_core::RateRule>,
            ) -> Result<(), $crate::storage::state::StoreError> {
                $crate::storage::state::put_rate_rule(self, topic, rule)
            }
        }
    };
}
pub(crate) use state_store_via_kv;

/// Lets the engine hold any backend chosen at run time.
impl StateStore for Box<dyn StateStore> {
    fn load(&self) -> Result<Loaded, StoreError> {
        (**self).load()
    }

    fn apply(&mut self, batch: &PersistBatch, now_wall_ms: u64) -> Result<(), StoreError> {
        (**self).apply(batch, now_wall_ms)
    }

    fn dlq_list(
        &self,
        group: &GroupName,
        after: Option<&DlqKey>,
        max: usize,
    ) -> Result<Vec<DlqEntry>, StoreError> {
        (**self).dlq_list(group, after, max)
    }

    fn dlq_count(&self, group: &GroupName) -> Result<u64, StoreError> {
        (**self).dlq_count(group)
    }

    fn put_rate_rule(
        &mut self,
        topic: &TopicName,
        rule: Option<RateRule>,
    ) -> Result<(), StoreError> {
        (**self).put_rate_rule(topic, rule)
    }
}

/// The net effect of `ops` on top of what a store holds now: key -> new value, or `None`
/// for a deletion. For backends whose atomic batches have no range deletion (sled,
/// memory); `keys_in(start, end)` lists the stored keys in `[start, end)`.
pub(crate) fn net_writes(ops: &[Op], keys_in: &mut KeysIn<'_>) -> Result<NetWrites, StoreError> {
    let mut net = NetWrites::new();
    for op in ops {
        match op {
            Op::Put { key, value } => {
                net.insert(key.clone(), Some(value.clone()));
            }
            Op::Delete { key } => {
                net.insert(key.clone(), None);
            }
            Op::DeleteRange { start, end } => {
                if start >= end {
                    continue;
                }
                for (_, v) in net.range_mut(start.clone()..end.clone()) {
                    *v = None;
                }
                for k in keys_in(start, end)? {
                    net.insert(k, None);
                }
            }
        }
    }
    Ok(net)
}
