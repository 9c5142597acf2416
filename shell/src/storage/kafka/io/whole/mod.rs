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
/// joins no group; the id names it to the broker) and what the topic is, for errors.
pub(super) struct Reader<'a> {
    pub role: &'static str,
    pub group_id: &'static str,
    pub what: &'a str,
}
