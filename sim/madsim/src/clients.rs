//! Model clients, as simulated tasks on a node of their own, calling the engine through the
//! front door like HTTP clients would:
//! - publishers send batches (`application/cloudevents-batch+json`, parsed by the shell's own
//!   publish parser) and retry the same events after any error — what was answered 2xx must
//!   never be lost, a retried event may be stored twice;
//! - pollers long-poll with a `max` and `waitMs` drawn each time, now and then go away
//!   mid-poll or lose an answer, and settle what they got: ACK (in time, late, twice, after
//!   an extend, out of order, in batches), NACK with or without a delay, or never; they ACK
//!   ids from their past (former incarnations' too) and ids never issued.
//!
//! - stream clients open a stream session (SSE or WebSocket: the engine's session API their
//!   HTTP handlers use; its transport half runs on the mesh node, as the handler does) with
//!   a window of credit, and settle what it writes as a poller does; writes fail, the
//!   connection closes with deliveries queued, and the client reconnects with the same id,
//!   now and then before its old connection closed.
//!
//! Once faults stop every client ACKs everything at once except poison events, which it
//! always NACKs (they end in the DLQ).
//!
//! Why the stream clients drive the engine's session API and not the axum routes: the
//! SSE response's keep-alive timer and the WebSocket upgrade (hyper's connection upgrade)
//! run on tokio itself, which madsim does not simulate (only `madsim_tokio` users are), so
//! the routes cannot run under madsim as they ship; the transport half here does what
//! `http/streams.rs` does with a session: take up to a batch, write, report `written` or
//! `failed` (and end the session at the first failure), drop the session when the
//! connection goes.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderValue};
use madsim_tokio as tokio;
use unimesh_core::{ClientId, Delivery, DeliveryId, GroupName, Millis, RecordMeta, TopicName};
use unimesh_shell::engine::{EngineError, Settling};
use unimesh_shell::event::{parse_publish, PublishLimits, BATCH_MEDIA_TYPE};
use unimesh_sim::rng::Rng;
use unimesh_sim::{Clause, SettleKind};

use unimesh_shell::engine::EngineHandle;

use crate::node::{call_on, CallError};
use crate::options::{ClientOptions, Transport};
use crate::world::{violation, World};

/// The type of events every client NACKs.
pub const POISON: &str = "poison.created";

async fn sleep_ms(ms: Millis) {
    tokio::time::sleep(Duration::from_millis(ms.max(1))).await;
}

/// The events `ids` of publisher `p` as one batch request body.
fn batch_body(rng: &mut Rng, world: &World, p: u32, ids: &[String]) -> Vec<u8> {
    let o = &world.opts;
    let events: Vec<serde_json::Value> = ids
        .iter()
        .map(|id| {
            let ty = if rng.chance(o.poison) {
                POISON
            } else {
                ["a.created", "b.created"][rng.index(2)]
            };
            let mut e = serde_json::json!({
                "specversion": "1.0",
                "id": id,
                "source": format!("/sim/publisher/{p}"),
                "type": ty,
                "datacontenttype": "application/json",
                "data": {"n": rng.below(1000)},
            });
            if rng.chance(o.key_share) {
                e["partitionkey"] = serde_json::json!(format!("k{}", rng.below(u64::from(o.keys))));
            }
            e
        })
        .collect();
    serde_json::to_vec(&events).unwrap_or_default()
}

/// Publishes `count` events named `p{p}-{n}` from `first` on, in batches, retrying each
/// batch until it is answered 2xx (or the run ends).
pub async fn publish(
    world: Arc<World>,
    topic: TopicName,
    p: u32,
    first: u32,
    count: u32,
    pace_ms: Millis,
    mut rng: Rng,
) {
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static(BATCH_MEDIA_TYPE),
    );
    let mut n = first;
    while n < first + count && world.failure().is_none() {
        let size = (rng.range(1, u64::from(world.opts.batch_max)) as u32).min(first + count - n);
        let ids: Vec<String> = (n..n + size).map(|i| format!("p{p}-{i}")).collect();
        let body = batch_body(&mut rng, &world, p, &ids);
        let events = match parse_publish(&headers, &body, &PublishLimits::default()) {
            Ok(events) => events,
            Err(e) => {
                world.fail(violation(
                    Clause::Core,
                    format!("the harness built a bad batch: {e}"),
                ));
                return;
            }
        };
        loop {
            let (w, t, e, i) = (world.clone(), topic.clone(), events.clone(), ids.clone());
            let delay = rng.range(0, world.opts.faults.net_delay_ms);
            // Any node takes a publish (a load balancer's choice); none to draw with one.
            let node = match world.nodes() {
                0 | 1 => 0,
                n => rng.index(n),
            };
            let answer = call_on(&world, node, delay, move |h| async move {
                let r = h.publish(&t, e).await;
                w.publish_answered(&t, &i, &r);
                r
            })
            .await;
            match answer {
                Ok(Ok(_)) => break,
                Ok(Err(EngineError::RateLimited { retry_after_ms })) => {
                    sleep_ms(retry_after_ms).await
                }
                Ok(Err(EngineError::Unavailable(_))) | Err(_) => {
                    world.count(|c| &mut c.publish_retries);
                    sleep_ms(rng.range(1, 50)).await;
                }
                Ok(Err(e)) => {
                    world.fail(violation(Clause::C9, format!("publish refused: {e}")));
                    return;
                }
            }
            if world.failure().is_some() {
                return;
            }
        }
        n += size;
        sleep_ms(rng.range(1, 2 * pace_ms)).await;
    }
}

/// What a poller does with one delivery while faults last.
#[derive(Clone, Copy, Debug)]
enum Plan {
    Ack {
        after_ms: Millis,
    },
    Twice {
        after_ms: Millis,
    },
    Late {
        after_ms: Millis,
    },
    Nack {
        delay_ms: Option<Millis>,
    },
    Extend {
        by_ms: Option<Millis>,
        then_ms: Millis,
    },
    Ignore,
}

/// One client of one group, connected to one mesh node (it polls and settles there: a
/// delivery is settled where its lane is owned).
pub struct Poller {
    pub world: Arc<World>,
    pub node: usize,
    pub group: GroupName,
    pub client: ClientId,
    pub opts: ClientOptions,
    pub ack_timeout_ms: Millis,
    pub rng: Rng,
    /// Ids it got, newest last (for stale ACKs).
    past: Vec<DeliveryId>,
}

impl Poller {
    pub fn new(
        world: Arc<World>,
        node: usize,
        group: GroupName,
        client: ClientId,
        opts: ClientOptions,
        ack_timeout_ms: Millis,
        rng: Rng,
    ) -> Self {
        Self {
            world,
            node,
            group,
            client,
            opts,
            ack_timeout_ms,
            rng,
            past: Vec::new(),
        }
    }

    fn delay(&mut self) -> Millis {
        self.rng.range(0, self.world.opts.faults.net_delay_ms)
    }

    /// Polls (or streams) until the run ends.
    pub async fn run(mut self) {
        if let Transport::Stream {
            window,
            write_fail,
            close,
            overlap,
        } = self.opts.transport
        {
            return self.stream(window, write_fail, close, overlap).await;
        }
        while self.world.failure().is_none() && !self.world.is_done() {
            let calm = !self.world.faults_on();
            let got = self.poll(calm).await;
            if let Some(got) = got {
                if calm {
                    self.settle_all(got);
                } else {
                    if self.rng.chance(self.opts.lose_response) {
                        self.world.count(|c| &mut c.responses_lost);
                    } else {
                        for d in got {
                            let plan = self.plan(&d);
                            self.carry_out(d.id, plan);
                        }
                    }
                    self.misbehave();
                }
            }
            let pause = if calm {
                self.rng.range(1, 10)
            } else {
                self.rng.range(1, self.opts.pause_ms)
            };
            sleep_ms(pause).await;
        }
    }

    /// Stream sessions until the run ends: one at a time (but for an overlap), each until
    /// the engine ends it, the node goes, or the client closes it.
    async fn stream(mut self, window: u32, write_fail: f64, close: f64, overlap: f64) {
        while self.world.failure().is_none() && !self.world.is_done() {
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            let (w, g, c) = (self.world.clone(), self.group.clone(), self.client.clone());
            let (node, rng) = (self.node, self.rng.fork());
            self.world.count(|c| &mut c.stream_sessions);
            let delay = self.delay();
            let world = self.world.clone();
            let mut session = Box::pin(async move {
                call_on(&world, node, delay, move |h| {
                    transport(h, w, node, g, c, window, write_fail, rng, tx)
                })
                .await
            });
            let mut closing = false;
            loop {
                // Biased: an unbiased `select!` draws its order from tokio's thread-local
                // generator, which madsim does not seed (module docs). What the transport
                // wrote before its connection ended is read first, as off a socket.
                tokio::select! {
                    biased;
                    got = rx.recv() => {
                        let Some(got) = got else { break };
                        for d in &got {
                            if self.past.len() >= 64 {
                                self.past.remove(0);
                            }
                            self.past.push(d.id);
                        }
                        if !self.world.faults_on() {
                            self.settle_all(got);
                            continue;
                        }
                        for d in got {
                            let plan = self.plan(&d);
                            self.carry_out(d.id, plan);
                        }
                        self.misbehave();
                        if self.rng.chance(close) {
                            closing = true;
                            break;
                        }
                    }
                    _ = &mut session => break,
                }
            }
            if closing {
                self.world.count(|c| &mut c.stream_closes);
                drop(rx);
                if self.rng.chance(overlap) {
                    // The old connection lingers while the client reconnects.
                    self.world.count(|c| &mut c.stream_overlaps);
                    let linger = Duration::from_millis(self.rng.range(1, 50));
                    tokio::spawn(async move {
                        let _ = tokio::time::timeout(linger, session).await;
                    });
                    continue;
                }
            }
            drop(session);
            sleep_ms(self.rng.range(1, self.opts.pause_ms)).await;
        }
    }

    /// One long-poll; None when it brought nothing usable (an error, a vanished poll).
    async fn poll(&mut self, calm: bool) -> Option<Vec<Delivery>> {
        let max = if calm {
            self.opts.poll_max
        } else {
            self.rng.range(1, u64::from(self.opts.poll_max)) as u32
        };
        let wait_ms = if calm {
            self.rng.range(0, 50)
        } else if self.rng.chance(0.2) {
            0
        } else {
            self.rng.range(1, self.opts.wait_ms)
        };
        let vanish = !calm && self.rng.chance(self.opts.vanish);
        let (w, g, c) = (self.world.clone(), self.group.clone(), self.client.clone());
        let delay = self.delay();
        let node = self.node;
        let request = call_on(&self.world, node, delay, move |h| async move {
            let r = h.poll(&g, &c, max, wait_ms).await;
            if let Ok(got) = &r {
                w.poll_received(node, &g, &c, max, got);
            }
            r
        });
        let answer = if vanish {
            let after = self.rng.range(0, wait_ms + delay + 1);
            match tokio::time::timeout(Duration::from_millis(after), request).await {
                Ok(a) => a,
                Err(_) => {
                    self.world.count(|c| &mut c.polls_vanished);
                    return None;
                }
            }
        } else {
            request.await
        };
        match answer {
            Ok(Ok(got)) => {
                for d in &got {
                    if self.past.len() >= 64 {
                        self.past.remove(0);
                    }
                    self.past.push(d.id);
                }
                Some(got)
            }
            // Before the group exists, while the node is down, after a reset: try again.
            Ok(Err(_)) | Err(CallError::Down) | Err(CallError::Reset) => None,
        }
    }

    fn plan(&mut self, d: &Delivery) -> Plan {
        if is_poison(d) {
            return Plan::Nack {
                delay_ms: Some(self.rng.range(0, 50)),
            };
        }
        let o = self.opts.clone();
        let u = self.rng.unit();
        let ack_ms = self.rng.range(0, o.ack_delay_ms);
        let mut edge = o.nack;
        if u < edge {
            let delay_ms = self.rng.chance(0.5).then(|| self.rng.range(0, 100));
            return Plan::Nack { delay_ms };
        }
        edge += o.ignore;
        if u < edge {
            return Plan::Ignore;
        }
        edge += o.late_ack;
        if u < edge {
            let after_ms = self.ack_timeout_ms + self.rng.range(1, 200);
            return Plan::Late { after_ms };
        }
        edge += o.double_ack;
        if u < edge {
            return Plan::Twice { after_ms: ack_ms };
        }
        edge += o.extend;
        if u < edge {
            let by_ms = self
                .rng
                .chance(0.5)
                .then(|| self.rng.range(1, 2 * self.ack_timeout_ms));
            return Plan::Extend {
                by_ms,
                then_ms: ack_ms,
            };
        }
        Plan::Ack { after_ms: ack_ms }
    }

    fn carry_out(&mut self, id: DeliveryId, plan: Plan) {
        let world = &self.world;
        match plan {
            Plan::Ack { after_ms } => {
                world.count(|c| &mut c.acks);
                self.settle_later(after_ms, SettleKind::Ack, vec![id]);
            }
            Plan::Twice { after_ms } => {
                world.count(|c| &mut c.double_acks);
                self.settle_later(after_ms, SettleKind::Ack, vec![id]);
                let again = after_ms + self.rng.range(0, 100);
                self.settle_later(again, SettleKind::Ack, vec![id]);
            }
            Plan::Late { after_ms } => {
                world.count(|c| &mut c.late_acks);
                self.settle_later(after_ms, SettleKind::Ack, vec![id]);
            }
            Plan::Nack { delay_ms } => {
                world.count(|c| &mut c.nacks);
                let after = self.rng.range(0, 20);
                self.settle_later(after, SettleKind::Nack(delay_ms), vec![id]);
            }
            Plan::Extend { by_ms, then_ms } => {
                world.count(|c| &mut c.extends);
                let at = self.rng.range(0, self.ack_timeout_ms / 2);
                self.settle_later(at, SettleKind::Extend(by_ms), vec![id]);
                self.settle_later(at + then_ms, SettleKind::Ack, vec![id]);
            }
            Plan::Ignore => world.count(|c| &mut c.ignored),
        }
    }

    /// Once faults stopped: one ACK for everything but poison (NACKed at once), ids in an
    /// order of their own.
    fn settle_all(&mut self, got: Vec<Delivery>) {
        let (poison, mut fine): (Vec<Delivery>, Vec<Delivery>) =
            got.into_iter().partition(is_poison);
        if !poison.is_empty() {
            self.settle_later(
                0,
                SettleKind::Nack(Some(0)),
                poison.iter().map(|d| d.id).collect(),
            );
        }
        if !fine.is_empty() {
            for i in (1..fine.len()).rev() {
                fine.swap(i, self.rng.index(i + 1));
            }
            self.settle_later(0, SettleKind::Ack, fine.iter().map(|d| d.id).collect());
        }
    }

    /// ACKs an id of its past (stale after a restart) or one never issued.
    fn misbehave(&mut self) {
        if !self.past.is_empty() && self.rng.chance(self.opts.stale_ack) {
            self.world.count(|c| &mut c.stale_acks);
            let id = self.past[self.rng.index(self.past.len())];
            self.settle_later(0, SettleKind::Ack, vec![id]);
        }
        if self.rng.chance(self.opts.bogus_ack) {
            self.world.count(|c| &mut c.bogus_acks);
            let epoch = self.past.last().map_or(1, |d| d.epoch);
            let bogus = DeliveryId {
                epoch: epoch + self.rng.below(2) as u32,
                lease: self.rng.range(0, 40),
                partition: self.rng.below(4) as u32,
                offset: self.rng.range(0, 300),
                attempt: self.rng.range(0, 6) as u32,
            };
            self.settle_later(0, SettleKind::Ack, vec![bogus]);
        }
    }

    /// Settles `ids` after `after_ms`, in a task of its own (settles overtake each other).
    fn settle_later(&mut self, after_ms: Millis, kind: SettleKind, ids: Vec<DeliveryId>) {
        let (world, group, node) = (self.world.clone(), self.group.clone(), self.node);
        let delay = self.delay();
        tokio::spawn(async move {
            if after_ms > 0 {
                sleep_ms(after_ms).await;
            }
            let how = match kind {
                SettleKind::Ack => Settling::Ack,
                SettleKind::Nack(delay_ms) => Settling::Nack { delay_ms },
                SettleKind::Extend(extend_ms) => Settling::Extend { extend_ms },
            };
            let w = world.clone();
            let _ = call_on(&world, node, delay, move |h| async move {
                let r = h.settle(&group, how, ids.clone()).await;
                w.settle_answered(node, &group, kind, &ids, &r);
                r
            })
            .await;
        });
    }
}

/// Deliveries a stream transport writes per batch (`http/streams.rs`).
const STREAM_BATCH: usize = 64;

/// The transport half of a stream session, on the mesh node: opens the session for
/// `client` with credit `window` and writes what it hands out to the connection (`to`),
/// reporting each batch `written` and, from the first write that fails (a fault drawn
/// with `write_fail` while faults last, or a connection the client closed), `failed`, and
/// ending the session then — as the WebSocket handler (`http/streams.rs`) does — until the
/// engine ends the session or the call is dropped (the connection went: the session's
/// stream is dropped with whatever is queued).
#[allow(clippy::too_many_arguments)]
async fn transport(
    engine: EngineHandle,
    world: Arc<World>,
    node: usize,
    group: GroupName,
    client: ClientId,
    window: u32,
    write_fail: f64,
    mut rng: Rng,
    to: tokio::sync::mpsc::UnboundedSender<Vec<Delivery>>,
) {
    let Ok(stream) = engine.open_stream(&group, &client, window).await else {
        return;
    };
    while let Some(batch) = stream.next(STREAM_BATCH).await {
        let mut written = Vec::with_capacity(batch.len());
        let mut failed = Vec::new();
        for d in batch {
            let fails = !failed.is_empty()
                || to.is_closed()
                || (world.faults_on() && rng.chance(write_fail));
            if fails {
                failed.push(d.id);
            } else {
                written.push(d);
            }
        }
        let n = written.len();
        if n > 0 {
            world.stream_written(node, &group, &client, window, &written);
            let _ = to.send(written);
        }
        stream.written(n);
        if !failed.is_empty() {
            // A connection whose write failed is gone: the session ends with it.
            world.count(|c| &mut c.stream_writes_failed);
            stream.failed(failed);
            return;
        }
    }
}

fn is_poison(d: &Delivery) -> bool {
    matches!(&d.record.meta, RecordMeta::Event(m) if m.ty == POISON)
}
