//! The key space of a state store, shared by every backend.
//!
//! ```text
//! e                                         epoch
//! s/<group>                                 subscription
//! c/<group> \0 <partition u32 BE>           lane checkpoint
//! d/<group> \0 <partition u32 BE> <offset u64 BE>   DLQ entry
//! r/<topic>                                 rate-limit rule
//! ```
//!
//! Names only hold `[A-Za-z0-9._-]`, so `\0` cannot appear inside one: the prefix
//! `c/a\0` covers group `a` and never group `a.b`. Numbers are big-endian so that byte
//! order is numeric order and DLQ pages come out sorted by (partition, offset).

use unimesh_core::{DlqKey, GroupName, Offset, Partition, TopicName};

use super::StoreError;

pub(crate) const EPOCH: &[u8] = b"e";
const SUB: &[u8] = b"s/";
const CKPT: &[u8] = b"c/";
const DLQ: &[u8] = b"d/";
const RATE: &[u8] = b"r/";

const SEP: u8 = 0;

/// A half-open key range `[start, end)`.
pub(crate) struct KeyRange {
    pub start: Vec<u8>,
    pub end: Vec<u8>,
}

/// Every key starting with `prefix`. Prefixes here never end in 0xff, so incrementing the
/// last byte gives the exclusive end.
fn prefix_range(prefix: Vec<u8>) -> KeyRange {
    let mut end = prefix.clone();
    if let Some(last) = end.last_mut() {
        debug_assert!(*last != u8::MAX);
        *last += 1;
    }
    KeyRange { start: prefix, end }
}

fn with_name(kind: &[u8], name: &str, extra: usize) -> Vec<u8> {
    let mut k = Vec::with_capacity(kind.len() + name.len() + extra);
    k.extend_from_slice(kind);
    k.extend_from_slice(name.as_bytes());
    k
}

pub(crate) fn subscription(group: &GroupName) -> Vec<u8> {
    with_name(SUB, group.as_str(), 0)
}

pub(crate) fn subscriptions() -> KeyRange {
    prefix_range(SUB.to_vec())
}

pub(crate) fn checkpoint(group: &GroupName, partition: Partition) -> Vec<u8> {
    let mut k = with_name(CKPT, group.as_str(), 5);
    k.push(SEP);
    k.extend_from_slice(&partition.to_be_bytes());
    k
}

pub(crate) fn checkpoints() -> KeyRange {
    prefix_range(CKPT.to_vec())
}

pub(crate) fn group_checkpoints(group: &GroupName) -> KeyRange {
    let mut k = with_name(CKPT, group.as_str(), 1);
    k.push(SEP);
    prefix_range(k)
}

pub(crate) fn dlq(key: &DlqKey) -> Vec<u8> {
    let mut k = with_name(DLQ, key.group.as_str(), 13);
    k.push(SEP);
    k.extend_from_slice(&key.partition.to_be_bytes());
    k.extend_from_slice(&key.offset.to_be_bytes());
    k
}

pub(crate) fn group_dlq(group: &GroupName) -> KeyRange {
    let mut k = with_name(DLQ, group.as_str(), 1);
    k.push(SEP);
    prefix_range(k)
}

pub(crate) fn rate_rule(topic: &TopicName) -> Vec<u8> {
    with_name(RATE, topic.as_str(), 0)
}

pub(crate) fn rate_rules() -> KeyRange {
    prefix_range(RATE.to_vec())
}

fn corrupt(key: &[u8], why: &str) -> StoreError {
    StoreError::Corrupt {
        key: describe(key),
        why: format!("malformed key: {why}"),
    }
}

/// Splits `<kind><name>` or `<kind><name>\0<rest>` into the name and the rest. The
/// `try_*` parsers report a bare reason so that `describe` can use them without recursing.
fn split_name<'a>(key: &'a [u8], kind: &[u8]) -> Result<(&'a str, Option<&'a [u8]>), &'static str> {
    let body = key.strip_prefix(kind).ok_or("wrong kind prefix")?;
    let (name, rest) = match body.iter().position(|&b| b == SEP) {
        Some(i) => (&body[..i], Some(&body[i + 1..])),
        None => (body, None),
    };
    let name = std::str::from_utf8(name).map_err(|_| "name is not UTF-8")?;
    Ok((name, rest))
}

fn try_subscription(key: &[u8]) -> Result<GroupName, &'static str> {
    match split_name(key, SUB)? {
        (name, None) => GroupName::new(name).map_err(|e| e.reason),
        (_, Some(_)) => Err("separator after the group name"),
    }
}

fn try_checkpoint(key: &[u8]) -> Result<(GroupName, Partition), &'static str> {
    let (name, rest) = split_name(key, CKPT)?;
    let p: [u8; 4] = rest
        .unwrap_or_default()
        .try_into()
        .map_err(|_| "partition is not 4 bytes")?;
    let group = GroupName::new(name).map_err(|e| e.reason)?;
    Ok((group, Partition::from_be_bytes(p)))
}

fn try_dlq(key: &[u8]) -> Result<DlqKey, &'static str> {
    let (name, rest) = split_name(key, DLQ)?;
    let rest = rest.unwrap_or_default();
    if rest.len() != 12 {
        return Err("partition and offset are not 12 bytes");
    }
    let (p, o) = rest.split_at(4);
    let mut pb = [0u8; 4];
    pb.copy_from_slice(p);
    let mut ob = [0u8; 8];
    ob.copy_from_slice(o);
    let group = GroupName::new(name).map_err(|e| e.reason)?;
    Ok(DlqKey {
        group,
        partition: Partition::from_be_bytes(pb),
        offset: Offset::from_be_bytes(ob),
    })
}

fn try_rate_rule(key: &[u8]) -> Result<TopicName, &'static str> {
    match split_name(key, RATE)? {
        (name, None) => TopicName::new(name).map_err(|e| e.reason),
        (_, Some(_)) => Err("separator after the topic name"),
    }
}

pub(crate) fn parse_subscription(key: &[u8]) -> Result<GroupName, StoreError> {
    try_subscription(key).map_err(|why| corrupt(key, why))
}

pub(crate) fn parse_checkpoint(key: &[u8]) -> Result<(GroupName, Partition), StoreError> {
    try_checkpoint(key).map_err(|why| corrupt(key, why))
}

pub(crate) fn parse_dlq(key: &[u8]) -> Result<DlqKey, StoreError> {
    try_dlq(key).map_err(|why| corrupt(key, why))
}

pub(crate) fn parse_rate_rule(key: &[u8]) -> Result<TopicName, StoreError> {
    try_rate_rule(key).map_err(|why| corrupt(key, why))
}

/// A key as a person reads it in an error message: `checkpoint/orders/3`,
/// `dlq/orders/3/1200`, or the escaped bytes when it does not parse.
pub(crate) fn describe(key: &[u8]) -> String {
    if key == EPOCH {
        return "epoch".to_owned();
    }
    let escaped = || key.escape_ascii().to_string();
    let kind = key.get(..2).unwrap_or(key);
    let described = match kind {
        k if k == SUB => try_subscription(key)
            .ok()
            .map(|g| format!("subscription/{g}")),
        k if k == CKPT => try_checkpoint(key)
            .ok()
            .map(|(g, p)| format!("checkpoint/{g}/{p}")),
        k if k == DLQ => try_dlq(key)
            .ok()
            .map(|d| format!("dlq/{}/{}/{}", d.group, d.partition, d.offset)),
        k if k == RATE => try_rate_rule(key).ok().map(|t| format!("ratelimit/{t}")),
        _ => None,
    };
    described.unwrap_or_else(escaped)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(s: &str) -> GroupName {
        GroupName::new(s).unwrap()
    }

    #[test]
    fn keys_parse_back() {
        let k = DlqKey {
            group: g("a.b"),
            partition: 7,
            offset: u64::MAX - 1,
        };
        assert_eq!(parse_dlq(&dlq(&k)).unwrap(), k);
        assert_eq!(
            parse_checkpoint(&checkpoint(&g("x"), 9)).unwrap(),
            (g("x"), 9)
        );
        assert_eq!(
            parse_subscription(&subscription(&g("x-y"))).unwrap(),
            g("x-y")
        );
        let t = TopicName::new("orders").unwrap();
        assert_eq!(parse_rate_rule(&rate_rule(&t)).unwrap(), t);
    }

    #[test]
    fn a_group_prefix_does_not_cover_a_longer_name() {
        let r = group_dlq(&g("a"));
        let inside = dlq(&DlqKey {
            group: g("a"),
            partition: u32::MAX,
            offset: u64::MAX,
        });
        let other = dlq(&DlqKey {
            group: g("a.b"),
            partition: 0,
            offset: 0,
        });
        assert!(r.start <= inside && inside < r.end);
        assert!(!(r.start <= other && other < r.end));
        let r = group_checkpoints(&g("a"));
        let other = checkpoint(&g("a-"), 0);
        assert!(!(r.start <= other && other < r.end));
    }

    #[test]
    fn byte_order_is_numeric_order() {
        let key = |p, o| {
            dlq(&DlqKey {
                group: g("g"),
                partition: p,
                offset: o,
            })
        };
        assert!(key(1, 300) < key(1, 301));
        assert!(key(1, u64::MAX) < key(2, 0));
        assert!(key(0, 256) > key(0, 255));
    }

    #[test]
    fn descriptions_are_readable() {
        assert_eq!(
            describe(&checkpoint(&g("orders"), 3)),
            "checkpoint/orders/3"
        );
        assert_eq!(describe(EPOCH), "epoch");
        assert_eq!(describe(b"c/bad/name\0\x01"), "c/bad/name\\x00\\x01");
    }
}
