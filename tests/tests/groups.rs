//! Two groups on one topic each get every event (broadcast), with separate progress (a fast
//! group never moves a slow one: C7); two clients of one group share its events, each event
//! to exactly one of them (clustering); `startFrom: latest` skips what was there before.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use unimesh_tests::{event, json, published, Delivery, Published, Server, Value};

const WAIT: Duration = Duration::from_secs(60);

fn publish_n(s: &Server, topic: &str, prefix: &str, n: usize) -> Vec<Published> {
    let events: Vec<Value> = (0..n)
        .map(|i| event(&format!("{prefix}-{i}"), "t", json!({ "i": i })))
        .collect();
    published(&s.publish_batch(topic, &events), n)
}

fn positions(p: &[Published]) -> BTreeMap<(u32, u64), String> {
    p.iter()
        .map(|r| ((r.partition, r.offset), r.id.clone()))
        .collect()
}

fn delivered_positions(d: &[Delivery]) -> BTreeMap<(u32, u64), String> {
    let mut out = BTreeMap::new();
    for x in d {
        let prev = out.insert((x.partition, x.offset), x.event_id().to_owned());
        assert!(
            prev.is_none(),
            "({}, {}) delivered twice",
            x.partition,
            x.offset
        );
    }
    out
}

fn ack(s: &Server, group: &str, d: &[Delivery]) {
    let ids: Vec<&str> = d.iter().map(|x| x.id.as_str()).collect();
    s.ack(group, &ids).all_ok(ids.len());
}

#[test]
fn two_groups_each_get_every_event_with_separate_progress() {
    let s = Server::start_default();
    let doc = json!({ "topic": "bc", "ackTimeoutMs": 60000 });
    s.subscribe("fast", &doc);
    s.subscribe("slow", &doc);
    let p = publish_n(&s, "bc", "bc", 60);
    let want = positions(&p);

    // The fast group takes and ACKs everything while the slow one does nothing.
    let fast = s.poll_n("fast", "f1", want.len(), WAIT);
    assert_eq!(
        delivered_positions(&fast),
        want,
        "fast group: every event, once"
    );
    ack(&s, "fast", &fast);

    // C7: the slow group's progress did not move with the fast one's.
    let offsets =
        unimesh_tests::wait_for("the fast group's watermark to reach the end", WAIT, || {
            let o = s.offsets("bc");
            let done = o
                .iter()
                .filter(|((g, _), _)| g == "fast")
                .all(|(_, r)| r["watermark"] == r["end"]);
            done.then_some(o)
        });
    let mut slow_rows = 0;
    for ((g, part), row) in &offsets {
        if g == "slow" {
            slow_rows += 1;
            assert_eq!(row["watermark"], 0, "slow group, partition {part}: {row}");
            let end = row["end"].as_u64().unwrap_or_default();
            assert_eq!(
                row["lag"].as_u64(),
                Some(end),
                "slow lag is the whole log: {row}"
            );
        }
    }
    assert!(slow_rows > 0, "offsets list the slow group: {offsets:?}");

    // The slow group still gets every event, with the same positions.
    let slow = s.poll_n("slow", "s1", want.len(), WAIT);
    assert_eq!(
        delivered_positions(&slow),
        want,
        "slow group: every event, once"
    );
    ack(&s, "slow", &slow);
    for g in ["fast", "slow"] {
        let more = s.poll(g, "x", 100, 200);
        assert!(more.is_empty(), "{g}: ACKed events came back: {more:?}");
    }
}

#[test]
fn clients_of_one_group_each_get_a_share_and_no_event_twice() {
    let s = Server::start_default();
    s.subscribe("cl", &json!({ "topic": "cl-t", "ackTimeoutMs": 60000 }));
    let p = publish_n(&s, "cl-t", "cl", 40);
    let want = positions(&p);

    // Alternate two clients that hold what they got: each gets its own events.
    let a = s.poll_n("cl", "a", 5, WAIT);
    let b = s.poll_n("cl", "b", 5, WAIT);
    let ids_a: BTreeSet<_> = a.iter().map(|d| (d.partition, d.offset)).collect();
    let ids_b: BTreeSet<_> = b.iter().map(|d| (d.partition, d.offset)).collect();
    assert_eq!(ids_a.len(), 5);
    assert_eq!(ids_b.len(), 5);
    assert!(
        ids_a.is_disjoint(&ids_b),
        "a held event went to the other client too: {ids_a:?} {ids_b:?}"
    );
    let clients = s.admin_get("/admin/clients").ok_json(200);
    let listed: BTreeSet<String> = clients["clients"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|c| c["group"] == "cl")
                .filter_map(|c| c["client"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(
        listed,
        BTreeSet::from(["a".to_owned(), "b".to_owned()]),
        "{clients}"
    );

    // Then both compete concurrently for the rest, ACKing as they go.
    let mut all: Vec<Delivery> = a.clone();
    all.extend(b.iter().cloned());
    ack(&s, "cl", &a);
    ack(&s, "cl", &b);
    let remaining = want.len() - all.len();
    let got = std::sync::Mutex::new(Vec::<(String, Delivery)>::new());
    std::thread::scope(|scope| {
        for client in ["a", "b"] {
            let got = &got;
            let s = &s;
            scope.spawn(move || {
                let started = std::time::Instant::now();
                loop {
                    let total = got.lock().map(|g| g.len()).unwrap_or(usize::MAX);
                    if total >= remaining {
                        break;
                    }
                    assert!(
                        started.elapsed() < WAIT,
                        "{client}: the rest did not arrive"
                    );
                    let d = s.poll("cl", client, 3, 200);
                    ack(s, "cl", &d);
                    if let Ok(mut g) = got.lock() {
                        g.extend(d.into_iter().map(|x| (client.to_owned(), x)));
                    }
                }
            });
        }
    });
    let got = got.into_inner().unwrap_or_default();
    all.extend(got.into_iter().map(|(_, d)| d));
    assert_eq!(
        delivered_positions(&all),
        want,
        "every event to exactly one client"
    );
    let more = s.poll("cl", "a", 100, 200);
    assert!(more.is_empty(), "events came back after ACK: {more:?}");
}

#[test]
fn start_from_latest_skips_what_was_published_before() {
    let s = Server::start_default();
    s.subscribe("early", &json!({ "topic": "sl", "ackTimeoutMs": 60000 }));
    let before = publish_n(&s, "sl", "before", 10);
    s.subscribe(
        "late",
        &json!({ "topic": "sl", "ackTimeoutMs": 60000, "startFrom": "latest" }),
    );
    let after = publish_n(&s, "sl", "after", 10);

    let late = s.poll_n("late", "l", after.len(), WAIT);
    assert_eq!(delivered_positions(&late), positions(&after));
    let extra = s.poll("late", "l", 100, 300);
    assert!(
        extra.is_empty(),
        "a latest group got older events: {extra:?}"
    );

    let mut all = positions(&before);
    all.extend(positions(&after));
    let early = s.poll_n("early", "e", all.len(), WAIT);
    assert_eq!(delivered_positions(&early), all);
}
