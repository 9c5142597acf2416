//! The engine task's own rules, driven input by input on in-memory ports.

use std::sync::Arc;

use madsim_tokio as tokio;

use unimesh_core::{ClientId, GroupName, MeshConfig, Recovered, SubscriptionSpec, TopicName};

use super::*;
use crate::engine::api::Shared;
use crate::engine::{MemoryLog, StoreAdapter};
use crate::storage::log::AppendItem;
use crate::storage::state::{MemoryDisk, MemoryStore};

fn task(log: Arc<MemoryLog>) -> EngineTask {
    let mesh = Mesh::new(MeshConfig::default(), Recovered::default(), 0).expect("a fresh mesh");
    let (_commands_tx, commands_rx) = mpsc::channel(8);
    let (persist_tx, persist_rx) = mpsc::channel(64);
    let (events_tx, events_rx) = mpsc::channel(64);
    let events_tx_writer = events_tx.clone();
    let state = Arc::new(StoreAdapter::new(Box::new(MemoryStore::open(
        MemoryDisk::new(),
    ))));
    let task = EngineTask::new(
        mesh,
        Arc::new(log),
        Arc::new(Shared::default()),
        commands_rx,
        persist_tx,
        (events_tx, events_rx),
        mpsc::unbounded_channel(),
        0,
        1 << 20,
    );
    tokio::spawn(crate::engine::persist::persist_writer(
        state,
        persist_rx,
        events_tx_writer,
        task.fences.clone(),
    ));
    task
}

/// Feeds the task's completions (fetches, persists) until `done` or 200 of them.
async fn pump(task: &mut EngineTask, mut done: impl FnMut(&EngineTask) -> bool) {
    for _ in 0..200 {
        if done(task) {
            return;
        }
        let next = tokio::time::timeout(std::time::Duration::from_secs(5), task.events_rx.recv());
        match next.await {
            Ok(Some(event)) => task.on_event(event),
            _ => break,
        }
    }
}

/// Goal: a delivery the core hands to a client that has no session (its poll or stream
/// ended in a race) goes back to the core once, and is not handed straight back to the
/// same client. Method: give a client credit with no session behind it, fetch 40 records
/// into the group, and count: each handed out once, NACKed (requeued) once, never handed
/// out again (the client's credit is withdrawn first), none dead-lettered. Handing the
/// NACK to the core from inside the effect drain, with the credit left, redelivered each
/// record to the same client until its attempts ran out (dead-lettered) and, with many
/// records, overflowed the stack (found by schemathesis).
#[tokio::test]
async fn a_delivery_without_a_session_goes_back_once_without_burning_attempts() {
    let log = Arc::new(MemoryLog::new(1));
    let topic = TopicName::new("orders").expect("a valid name");
    let group = GroupName::new("billing").expect("a valid name");
    let items = (0..40)
        .map(|i| {
            let e = format!(
                r#"{{"specversion":"1.0","id":"e{i}","source":"/t","type":"t","data":{i}}}"#
            );
            let headers = {
                let mut h = http::HeaderMap::new();
                h.insert(
                    "content-type",
                    "application/cloudevents+json"
                        .parse()
                        .expect("a header value"),
                );
                h
            };
            let ev = crate::event::parse_publish(
                &headers,
                e.as_bytes(),
                &crate::event::PublishLimits::default(),
            )
            .expect("a valid event")
            .remove(0);
            AppendItem {
                key: None,
                value: ev.stored(),
            }
        })
        .collect();
    log.append(topic.clone(), items).await.expect("appended");

    let mut task = task(log.clone());
    let mut spec = SubscriptionSpec::new(group.clone(), topic.clone());
    spec.max_attempts = 3;
    assert!(matches!(task.handle(Input::Subscribe(spec)), Response::Ok));
    let facts = LogPort::prepare_topic(&log, topic.clone(), true)
        .await
        .expect("the topic");
    task.assign_all(&group, &facts).expect("assigned");
    let ghost = ClientId::new("ghost").expect("a valid id");
    let _ = task.handle(Input::ClientPoll {
        group: group.clone(),
        client: ghost.clone(),
        max: 100,
    });
    pump(&mut task, |t| {
        t.mesh
            .group_view(&group)
            .is_some_and(|v| v.stats.nacked >= 40 || v.stats.dead_lettered > 0)
    })
    .await;

    let view = task.mesh.group_view(&group).expect("the group");
    assert_eq!(view.stats.delivered, 40, "{:?}", view.stats);
    assert_eq!(view.stats.nacked, 40, "{:?}", view.stats);
    // Requeued once each (the NACK), never handed out a second time.
    assert_eq!(view.stats.redelivered, 40, "{:?}", view.stats);
    assert_eq!(view.stats.dead_lettered, 0, "{:?}", view.stats);
    let ghost_view = view.clients.iter().find(|c| c.id == ghost);
    assert!(
        ghost_view.is_none_or(|c| c.credit == 0 && c.in_flight == 0),
        "{ghost_view:?}"
    );
    assert!(task.orphans.is_empty());
}
