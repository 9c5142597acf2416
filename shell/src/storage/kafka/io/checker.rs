//! A group consumer's checker thread: every read of the log a fetch may need before it
//! is answered — the check of what a lane knows against the log (`rules/epochs.rs`), the
//! broker's offsets with a claimed end read before it is believed, and where a stream must
//! start so that it holds every record from a position on — done off the consumer thread.
//!
//! Those reads go through the leader-epoch probe (`probe.rs`) and may take seconds each (a
//! broker that misreports a partition's end makes the probe look back, each look-back
//! waiting [`super::probe`]'s quiet time). The consumer thread is the thread that serves the
//! group's rebalance callbacks: a revocation waiting behind such reads held a partition a
//! restarted instance had been given for 37 s, until the group gave it back (tansu,
//! `tests/kafka_failover.rs`, DESIGN §8). So the consumer thread hands a fetch's reads here
//! as a [`Job`], keeps serving its poll, and goes on with the fetch when the [`Done`]
//! comes back; everything that changes the consumer (seeks, assignments) stays on it.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::mpsc as std_mpsc;
use std::time::Instant;

use unimesh_core::{GroupName, Offset, Partition, TopicName};

use super::log::KafkaLog;
use super::probe::EpochProbe;
use crate::storage::kafka::rules::epochs::{divergence, evident_end};
use crate::storage::kafka::rules::part::{Span, Validate};
use crate::storage::ports::StorageError;

/// What a check of a lane against the log found: the log's (earliest, divergence point)
/// when it diverged, and the log's (earliest, end) when the check read them afresh.
pub(super) type Validated = (Option<Span>, Option<Span>);

/// The reads one fetch needs before it is answered, in the order they are done; a read
/// whose answer ends the fetch (an error, a divergence, a position outside the log) stops
/// the reads after it.
#[derive(Debug, Default)]
pub(super) struct Reads {
    /// The lane's check against the log.
    pub validate: Option<Validate>,
    /// The log's (earliest, end), the end read before it is believed when it is below
    /// this offset (the lane knows offsets up to it).
    pub range: Option<Offset>,
    /// Read where the stream must start for the fetch's position, the log's earliest
    /// being this.
    pub start: Option<Offset>,
}

/// A fetch's [`Reads`], handed to the checker thread.
#[derive(Debug)]
pub(super) struct Job {
    pub partition: Partition,
    /// Names the fetch waiting on it (a later fetch or a rebalance makes it stale).
    pub number: u64,
    /// The position the fetch asks for.
    pub from: Offset,
    pub reads: Reads,
}

/// The answers of a [`Job`] (each `None` when not asked or not reached).
#[derive(Debug, Default)]
pub(super) struct Checked {
    pub validated: Option<Result<Validated, StorageError>>,
    /// The log's (earliest, end); `Some(None)`: it could not be read (no verdict).
    pub range: Option<Option<Span>>,
    /// (position, where the stream starts for it).
    pub start: Option<(Offset, Offset)>,
}

impl Checked {
    /// `self`, with what `later` answered in place of what it holds.
    pub fn and(self, later: Checked) -> Checked {
        Checked {
            validated: later.validated.or(self.validated),
            range: later.range.or(self.range),
            start: later.start.or(self.start),
        }
    }
}

/// A job's answers, back to the consumer thread.
pub(super) struct Done {
    pub partition: Partition,
    pub number: u64,
    pub checked: Checked,
}

/// A partition end claim a read of the log refuted: the claim, and the end the log showed.
#[derive(Clone, Copy, Debug)]
struct Refuted {
    claim: Offset,
    shown: Offset,
}

/// The checker thread's state: the probe it reads with (made when first needed), and per
/// partition the last end claim a read refuted (present: logged at warn once).
pub(super) struct Checker {
    log: KafkaLog,
    group: GroupName,
    topic: TopicName,
    probe: Option<EpochProbe>,
    anomalies: BTreeMap<Partition, Refuted>,
}

impl Checker {
    pub fn new(log: KafkaLog, group: GroupName, topic: TopicName) -> Self {
        Self {
            log,
            group,
            topic,
            probe: None,
            anomalies: BTreeMap::new(),
        }
    }

    /// Starts the thread: jobs in, answers out, until either channel closes.
    pub fn spawn(
        mut self,
        jobs: std_mpsc::Receiver<Job>,
        done: std_mpsc::Sender<Done>,
    ) -> std::io::Result<std::thread::JoinHandle<()>> {
        let (g, t) = (self.group.clone(), self.topic.clone());
        std::thread::Builder::new()
            .name(format!("kafka-check-{}", self.group))
            .spawn(move || {
                let span = tracing::info_span!("kafka_checker", group = %g, topic = %t);
                span.in_scope(|| {
                    while let Ok(job) = jobs.recv() {
                        let checked = self.check(&job);
                        let answer = Done {
                            partition: job.partition,
                            number: job.number,
                            checked,
                        };
                        if done.send(answer).is_err() {
                            break;
                        }
                    }
                })
            })
    }

    /// Does `job`'s reads, in order, stopping at one whose answer ends the fetch.
    fn check(&mut self, job: &Job) -> Checked {
        let mut c = Checked::default();
        let p = job.partition;
        let mut fresh = None;
        if let Some(v) = job.reads.validate {
            let validated = self.validate(p, v);
            let goes_on = matches!(validated, Ok((None, _)));
            if let Ok((_, f)) = &validated {
                fresh = *f;
            }
            c.validated = Some(validated);
            if !goes_on {
                return c;
            }
        }
        if let Some(known) = job.reads.range {
            // The offsets the check just read, when it read them, serve here too.
            let range = fresh.or_else(|| {
                self.log
                    .inner
                    .side
                    .runtime
                    .block_on(self.log.watermarks(&self.topic, p))
                    .ok()
                    .and_then(|r| self.claimed_range(p, r, known))
            });
            c.range = Some(range);
            if range.is_some_and(|(earliest, end)| job.from < earliest || job.from > end) {
                return c;
            }
        }
        if let Some(earliest) = job.reads.start {
            c.start = Some((job.from, self.stream_start(p, job.from, earliest)));
        }
        c
    }

    /// The probe, made when first needed.
    fn probe(&mut self) -> Result<&EpochProbe, StorageError> {
        if self.probe.is_none() {
            let made = self
                .log
                .inner
                .side
                .runtime
                .block_on(EpochProbe::new(self.log.settings()))?;
            self.probe = Some(made);
        }
        self.probe
            .as_ref()
            .ok_or_else(|| StorageError::unavailable("no leader-epoch probe"))
    }

    /// Where to read `partition` from so that the stream holds every record at or after
    /// `at` ([`crate::storage::kafka::rules::epochs::read_looking_back`]: a broker may
    /// answer a read from inside a record batch with the next batch; tansu 0.6.0 does).
    /// `at` itself when it is the log's earliest, or when the log cannot be read now
    /// (logged: the stream is then read as the broker answers it).
    fn stream_start(&mut self, partition: Partition, at: Offset, earliest: Offset) -> Offset {
        if at <= earliest {
            return at;
        }
        let (group, topic) = (self.group.clone(), self.topic.clone());
        let read = self
            .probe()
            .and_then(|p| p.read(topic.as_str(), partition, at, earliest, None));
        match read {
            Ok(read) => {
                if read.from < at && read.hit.is_some_and(|(o, _)| o > at) {
                    tracing::debug!(%group, partition, at, from = read.from, "a gap after the read position confirmed by a read from further back");
                }
                if read.from + 1 < at {
                    // More than the one record a whole-batch broker needs at a gap or
                    // the log's end: the broker skipped records from `at`.
                    self.log
                        .counters()
                        .gaps_refuted
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::info!(%group, partition, at, from = read.from, "the broker answers a read from here with a later batch; reading from further back");
                }
                read.from
            }
            Err(e) => {
                tracing::warn!(%group, partition, at, error = %e, "cannot check where to read from; reading from the position as the broker answers it");
                at
            }
        }
    }

    /// Checks what a lane knows against the log ([`divergence`]); an error when the log
    /// could not be read (the check stays due).
    fn validate(&mut self, partition: Partition, v: Validate) -> Result<Validated, StorageError> {
        let (earliest, claimed) = match v.range {
            Some(r) => r,
            None => self
                .log
                .inner
                .side
                .runtime
                .block_on(self.log.watermarks(&self.topic, partition))?,
        };
        let started = Instant::now();
        let mut reads = 0u32;
        let end = self.evident(partition, (earliest, claimed), v.known_end, &mut reads)?;
        if v.stamp.is_some() {
            self.probe()?;
        }
        let topic = self.topic.clone();
        let probe = self.probe.as_ref();
        let d = divergence(v.stamp, earliest, end, v.known_end, |o| {
            reads += 1;
            match probe {
                Some(p) => p.first_at(topic.as_str(), partition, o, earliest, Some(end)),
                None => Err(StorageError::unavailable("no leader-epoch probe")),
            }
        })?;
        tracing::debug!(group = %self.group, partition, stamp = ?v.stamp, known_end = v.known_end, earliest, claimed, end, diverged_at = ?d, reads, elapsed_ms = started.elapsed().as_millis() as u64, "lane checked against the log");
        let fresh = v.range.is_none().then_some((earliest, end));
        Ok((d.map(|d| (earliest, d)), fresh))
    }

    /// The end of `partition`'s log for a lane that knows offsets below `known_end`, when
    /// the broker claims `claimed` ([`evident_end`]: a claim below what the lane knows is
    /// read before it is believed). A refuted claim is counted and logged (once per
    /// partition and claim at warn); the end the log showed is kept for lag and later
    /// checks.
    fn evident(
        &mut self,
        partition: Partition,
        (earliest, claimed): Span,
        known_end: Offset,
        reads: &mut u32,
    ) -> Result<Offset, StorageError> {
        if claimed >= known_end {
            return Ok(claimed);
        }
        // The same claim refuted before, by a log that showed all the lane knows: not read
        // again (tansu repeats its claim until the next batch arrives).
        if let Some(r) = self.anomalies.get(&partition) {
            if r.claim == claimed && r.shown >= known_end {
                self.log
                    .counters()
                    .end_anomalies
                    .fetch_add(1, Ordering::Relaxed);
                return Ok(r.shown);
            }
        }
        let topic = self.topic.clone();
        let probe = self.probe()?;
        let checked = evident_end(claimed, known_end, |o| {
            *reads += 1;
            probe.first_at(topic.as_str(), partition, o, earliest, None)
        })?;
        if checked.refuted {
            self.log
                .counters()
                .end_anomalies
                .fetch_add(1, Ordering::Relaxed);
            let refuted = Refuted {
                claim: claimed,
                shown: checked.end,
            };
            if self.anomalies.insert(partition, refuted).is_none() {
                tracing::warn!(group = %self.group, partition, claimed, shown = checked.end, known_end, "the broker claimed an end below records it holds; kept everything (counted in unimesh_kafka_end_anomalies_total, logged once per partition)");
            } else {
                tracing::debug!(group = %self.group, partition, claimed, shown = checked.end, "end claim refuted again");
            }
        }
        self.log
            .show_end(&self.topic, partition, checked.end, !checked.refuted);
        Ok(checked.end)
    }

    /// `range` as claimed by the broker, its end checked by [`Self::evident`] when it is
    /// below `known_end`; `None` when the log could not be read (no verdict: the fetch
    /// goes on).
    fn claimed_range(
        &mut self,
        partition: Partition,
        range: Span,
        known_end: Offset,
    ) -> Option<Span> {
        let mut reads = 0;
        match self.evident(partition, range, known_end, &mut reads) {
            Ok(end) => Some((range.0, end)),
            Err(e) => {
                tracing::warn!(group = %self.group, partition, error = %e, "cannot check the broker's end offset against the log");
                None
            }
        }
    }
}
