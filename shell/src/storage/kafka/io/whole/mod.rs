//! A whole topic read to its end, once: the DLQ ledger of a group (`dlq`) and, at start,
//! the subscription definitions (`subscriptions`).
//!
//! "Its end" is where this reader's own fetches reached the end of every partition
//! (librdkafka's partition EOF, from the high watermark of a fetch answer this reader,
//! made for this read, asked for), and at least the end the broker claims: a claimed end
//! alone is not evidence (tansu 0.6.0 claims the start of a partition's last batch plus
//! one, and a DLQ browse stopped there showed 6 of 10 entries; issue 18).
//!
//! `cfg(madsim)` chooses whole files: `real.rs` reads with librdkafka's blocking
//! consumer, `sim.rs` with the simulated consumer, which polls asynchronously.

#[cfg(not(madsim))]
mod real;
#[cfg(madsim)]
mod sim;

#[cfg(not(madsim))]
pub(super) use real::read;
#[cfg(madsim)]
pub(super) use sim::read;

/// Who reads: the consumer's role in the logs (`DLQ reader`), its `group.id` suffix (it
/// joins no group; the id names it to the broker), what the topic is, for errors, and what
/// the read does without the broker's claimed end.
pub(super) struct Reader<'a> {
    pub role: &'static str,
    pub group_id: &'static str,
    pub what: &'a str,
    pub unclaimed: Unclaimed,
}

/// What a read does when the broker does not answer a partition's end offset (Kafka's
/// ListOffsets, which a broker refuses for a moment while a partition's leader moves).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Unclaimed {
    /// The read fails (its caller answers an error and may be asked again).
    Fails,
    /// The read goes on to where its own fetches reach the end, warning: a start must not
    /// stop on a query that a takeover after it asks again (`tests/kafka_barrier.rs`).
    ReadsToItsEnd,
}
