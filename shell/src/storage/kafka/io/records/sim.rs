//! Records in and out of madsim-rdkafka's simulated broker, which carries no headers: they
//! travel in front of the value in the frame of `sim_frame.rs`.

use madsim_rdkafka::producer::FutureRecord;
use madsim_rdkafka::Message;

use super::sim_frame;
use super::HeaderList;

/// The headers and value of a record to send: the headers framed in front of the value.
pub struct Outgoing {
    value: Vec<u8>,
}

impl Outgoing {
    pub fn new(headers: &[(&str, &[u8])], value: &[u8]) -> Self {
        Self {
            value: sim_frame::encode(headers, value),
        }
    }

    /// The record to `topic` (its key set by the caller).
    pub fn record<'r>(&'r self, topic: &'r str) -> FutureRecord<'r, str, [u8]> {
        FutureRecord::to(topic).payload(self.value.as_slice())
    }
}

/// The headers and value of a received record: a value without the frame is a record
/// without headers.
pub fn incoming<M: Message>(m: &M) -> (HeaderList<'_>, Option<&[u8]>) {
    match m.payload().and_then(sim_frame::decode) {
        Some((headers, value)) => (headers, Some(value)),
        None => (Vec::new(), m.payload()),
    }
}

/// `value` as the simulated broker stores it with `headers`: with headers, their frame in
/// front of it (what [`Outgoing`] sends); without, the value itself.
pub fn stored_value(headers: &[(&str, &[u8])], value: &[u8]) -> Vec<u8> {
    if !headers.is_empty() {
        return sim_frame::encode(headers, value);
    }
    value.to_vec()
}

/// The value of a stored record without its headers frame, for a simulation that reads
/// the broker's bytes.
pub fn unframed(stored: &[u8]) -> &[u8] {
    if let Some((_, value)) = sim_frame::decode(stored) {
        return value;
    }
    stored
}
