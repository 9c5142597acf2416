//! Kafka records in and out: the headers and value of a record as this build's broker
//! carries them, and a data record as the core's record — the one conversion every reader
//! of a data topic uses (the group consumer, the explicit-assignment consumer, and a
//! simulation's view of what the broker holds), so they cannot disagree about a record.
//!
//! madsim-rdkafka's simulated broker (`--cfg madsim`) carries no headers: its
//! `OwnedHeaders` has no constructor. There the headers travel in front of the value in a
//! frame of this file's own (`SIM_FRAME`), written and read only here, so the CloudEvents
//! binding (`event::to_kafka` / `from_kafka`) still runs whole under the simulator. A value
//! without the frame is a record without headers (what a foreign producer writes).

use std::borrow::Cow;
use std::sync::Arc;

use bytes::Bytes;
#[cfg(not(madsim))]
use madsim_rdkafka::message::{Header, Headers, OwnedHeaders};
use madsim_rdkafka::producer::FutureRecord;
use madsim_rdkafka::Message;
use unimesh_core::{Offset, Record, RecordMeta};

/// A record's headers, in order, as name and value.
pub(super) type HeaderList<'a> = Vec<(&'a str, Option<&'a [u8]>)>;

/// The value of the first header named `name` (as this mesh writes its own headers:
/// exactly), if it has one.
pub(super) fn header<'a>(headers: &HeaderList<'a>, name: &str) -> Option<&'a [u8]> {
    headers
        .iter()
        .find(|(k, _)| *k == name)
        .and_then(|(_, v)| *v)
}

/// The headers and value of a record to send.
pub(super) struct Outgoing<'a> {
    #[cfg(not(madsim))]
    headers: Option<OwnedHeaders>,
    value: Cow<'a, [u8]>,
}

impl<'a> Outgoing<'a> {
    pub fn new(headers: &[(&str, &[u8])], value: &'a [u8]) -> Self {
        #[cfg(not(madsim))]
        {
            let mut h = OwnedHeaders::new_with_capacity(headers.len());
            for (k, v) in headers {
                h = h.insert(Header {
                    key: k,
                    value: Some(*v),
                });
            }
            Self {
                headers: Some(h),
                value: Cow::Borrowed(value),
            }
        }
        #[cfg(madsim)]
        {
            Self {
                value: Cow::Owned(sim_frame::encode(headers, value)),
            }
        }
    }

    /// The record to `topic` (its key set by the caller).
    pub fn record<'r>(&'r self, topic: &'r str) -> FutureRecord<'r, str, [u8]> {
        let r = FutureRecord::to(topic).payload(self.value.as_ref());
        #[cfg(not(madsim))]
        let r = match &self.headers {
            Some(h) => r.headers(h.clone()),
            None => r,
        };
        r
    }
}

/// The headers and value of a received record.
pub(super) fn incoming<M: Message>(m: &M) -> (HeaderList<'_>, Option<&[u8]>) {
    #[cfg(not(madsim))]
    {
        let headers = m
            .headers()
            .map(|h| {
                (0..h.count())
                    .map(|i| {
                        let x = h.get(i);
                        (x.key, x.value)
                    })
                    .collect()
            })
            .unwrap_or_default();
        (headers, m.payload())
    }
    #[cfg(madsim)]
    {
        match m.payload().and_then(sim_frame::decode) {
            Some((headers, value)) => (headers, Some(value)),
            None => (Vec::new(), m.payload()),
        }
    }
}

/// `value` as this build's broker stores it with `headers`: the value itself, or under
/// madsim with headers, their frame in front of it (what [`Outgoing`] sends).
pub(super) fn stored_value(headers: &[(&str, &[u8])], value: &[u8]) -> Vec<u8> {
    #[cfg(madsim)]
    if !headers.is_empty() {
        return sim_frame::encode(headers, value);
    }
    let _ = headers;
    value.to_vec()
}

/// The value of a stored record without this build's headers frame (the value itself but
/// under madsim), for a simulation that reads the broker's bytes.
pub fn unframed(stored: &[u8]) -> &[u8] {
    #[cfg(madsim)]
    if let Some((_, value)) = sim_frame::decode(stored) {
        return value;
    }
    stored
}

/// A Kafka record as the core's record: its CloudEvent in the stored form, or the reason
/// it carries none (the core dead-letters it).
pub fn decode_message<M: Message>(m: &M, max_event_bytes: usize) -> Record {
    let offset = m.offset().max(0) as Offset;
    let (headers, payload) = incoming(m);
    match crate::event::from_kafka(&headers, payload, m.key(), max_event_bytes) {
        Ok(stored) => crate::storage::decode_record((offset, stored)),
        Err(e) => Record {
            offset,
            meta: RecordMeta::Undecodable(Arc::from(e.to_string())),
            body: Bytes::copy_from_slice(payload.unwrap_or_default()),
            broker_handle: None,
        },
    }
}

/// The headers frame of the simulated broker: `SIM_FRAME`, a u16 count, then per header a
/// u16 key length, the key, a u32 value length, the value; the record's value follows.
/// Big-endian. Anything that does not parse whole is not a frame.
#[cfg(any(madsim, test))]
mod sim_frame {
    pub const SIM_FRAME: &[u8; 8] = b"\0umhdrs\0";

    pub fn encode(headers: &[(&str, &[u8])], value: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(SIM_FRAME.len() + 2 + value.len() + 64);
        out.extend_from_slice(SIM_FRAME);
        let n = u16::try_from(headers.len()).unwrap_or(u16::MAX);
        out.extend_from_slice(&n.to_be_bytes());
        for (k, v) in headers.iter().take(usize::from(n)) {
            let kl = u16::try_from(k.len()).unwrap_or(u16::MAX);
            let vl = u32::try_from(v.len()).unwrap_or(u32::MAX);
            out.extend_from_slice(&kl.to_be_bytes());
            out.extend_from_slice(&k.as_bytes()[..usize::from(kl)]);
            out.extend_from_slice(&vl.to_be_bytes());
            out.extend_from_slice(&v[..vl as usize]);
        }
        out.extend_from_slice(value);
        out
    }

    pub fn decode(bytes: &[u8]) -> Option<(super::HeaderList<'_>, &[u8])> {
        let mut rest = bytes.strip_prefix(SIM_FRAME.as_slice())?;
        let mut take = |n: usize| -> Option<&[u8]> {
            let (head, tail) = (rest.get(..n)?, rest.get(n..)?);
            rest = tail;
            Some(head)
        };
        let count = u16::from_be_bytes(take(2)?.try_into().ok()?);
        let mut headers = Vec::with_capacity(usize::from(count));
        for _ in 0..count {
            let kl = u16::from_be_bytes(take(2)?.try_into().ok()?);
            let key = std::str::from_utf8(take(usize::from(kl))?).ok()?;
            let vl = u32::from_be_bytes(take(4)?.try_into().ok()?);
            let value = take(vl as usize)?;
            headers.push((key, Some(value)));
        }
        Some((headers, rest))
    }
}

#[cfg(test)]
mod tests {
    use super::sim_frame;

    /// Goal: the simulator's headers frame round-trips and never mistakes a foreign value
    /// for a frame. Method: encode/decode headers and a value; a truncated frame and plain
    /// bytes decode as "no frame".
    #[test]
    fn sim_frame_round_trips_and_rejects_partial_frames() {
        let headers: [(&str, &[u8]); 2] = [("ce_id", b"e-1"), ("content-type", b"text/plain")];
        let framed = sim_frame::encode(&headers, b"value");
        let (h, v) = sim_frame::decode(&framed).expect("a frame");
        assert_eq!(
            h,
            vec![
                ("ce_id", Some(&b"e-1"[..])),
                ("content-type", Some(&b"text/plain"[..]))
            ]
        );
        assert_eq!(v, b"value");
        assert!(sim_frame::decode(&framed[..framed.len() - 6 - 10]).is_none());
        assert!(sim_frame::decode(b"not an event 17").is_none());
        let empty = sim_frame::encode(&[], b"");
        assert_eq!(sim_frame::decode(&empty), Some((Vec::new(), &b""[..])));
    }
}
