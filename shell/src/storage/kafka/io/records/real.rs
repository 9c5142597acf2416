//! Records in and out of a real broker: the headers travel as Kafka headers, the value as
//! it is.

use madsim_rdkafka::message::{Header, Headers, OwnedHeaders};
use madsim_rdkafka::producer::FutureRecord;
use madsim_rdkafka::Message;

use super::HeaderList;

/// The headers and value of a record to send.
pub struct Outgoing<'a> {
    headers: OwnedHeaders,
    value: &'a [u8],
}

impl<'a> Outgoing<'a> {
    pub fn new(headers: &[(&str, &[u8])], value: &'a [u8]) -> Self {
        let mut h = OwnedHeaders::new_with_capacity(headers.len());
        for (k, v) in headers {
            h = h.insert(Header {
                key: k,
                value: Some(*v),
            });
        }
        Self { headers: h, value }
    }

    /// The record to `topic` (its key set by the caller).
    pub fn record<'r>(&'r self, topic: &'r str) -> FutureRecord<'r, str, [u8]> {
        FutureRecord::to(topic)
            .payload(self.value)
            .headers(self.headers.clone())
    }
}

/// The headers and value of a received record.
pub fn incoming<M: Message>(m: &M) -> (HeaderList<'_>, Option<&[u8]>) {
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

/// `value` as the broker stores it with `headers`: the value itself (the headers are the
/// record's own).
pub fn stored_value(_headers: &[(&str, &[u8])], value: &[u8]) -> Vec<u8> {
    value.to_vec()
}

/// The value of a stored record: the value itself (a real broker's records carry no
/// headers frame).
pub fn unframed(stored: &[u8]) -> &[u8] {
    stored
}
