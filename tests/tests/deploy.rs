//! The monitoring files in `deploy/` name only metrics unimesh exports.
//!
//! Goal: a metric renamed or removed in the code breaks the build until the Grafana
//! dashboard and the alert rules (and their unit tests) follow. Method: run the real binary
//! twice — on the embedded log and on Kafka (tansu), since each backend exports numbers of
//! its own — make the traffic that gives every family a sample (publish, a refused
//! publish, subscribe, poll, ACK, NACK, a redelivery), scrape `GET /metrics`, and check
//! every `unimesh_*` name in the files against the scrapes: it must be a sample name of a
//! family the scrape declares, with the suffixes OpenMetrics gives that family's type
//! (`_total` for a counter, `_bucket`/`_sum`/`_count` for a histogram, none for a gauge),
//! and some sample of it must be there.
//! (`deploy/check.sh` checks the files' PromQL with promtool; this checks their names.)

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use unimesh_tests::kafka::Broker;
use unimesh_tests::{event, json, published, Options, Server};

const WAIT: Duration = Duration::from_secs(60);

/// The files whose metric names are checked, relative to the repository root.
const FILES: [&str; 3] = [
    "deploy/grafana/unimesh.json",
    "deploy/prometheus/alerts.yml",
    "deploy/prometheus/alerts_test.yml",
];

/// Every `unimesh_*` identifier in `text` (a PromQL name: letters, digits, `_`), with the
/// number of times it occurs.
fn names_in(text: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    let bytes = text.as_bytes();
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b':';
    let mut from = 0;
    while let Some(at) = text[from..].find("unimesh_") {
        let start = from + at;
        let mut end = start + "unimesh_".len();
        while end < bytes.len() && ident(bytes[end]) {
            end += 1;
        }
        if start == 0 || !ident(bytes[start - 1]) {
            *out.entry(text[start..end].to_owned()).or_insert(0) += 1;
        }
        from = end;
    }
    out
}

/// What a scrape says: each family's type (`# TYPE name type`) and the sample names seen.
#[derive(Default)]
struct Scrape {
    families: BTreeMap<String, String>,
    samples: BTreeSet<String>,
}

impl Scrape {
    fn add(&mut self, text: &str) {
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut parts = rest.split_whitespace();
                if let (Some(name), Some(kind)) = (parts.next(), parts.next()) {
                    self.families.insert(name.to_owned(), kind.to_owned());
                }
            } else if !line.starts_with('#') && !line.is_empty() {
                let end = line.find(['{', ' ']).unwrap_or(line.len());
                self.samples.insert(line[..end].to_owned());
            }
        }
    }

    /// Why `name` is not a series Prometheus stores from these scrapes, or `None` if it is.
    fn problem(&self, name: &str) -> Option<String> {
        let suffixes: &[&str] = &["", "_total", "_created", "_bucket", "_sum", "_count"];
        let family = suffixes.iter().find_map(|s| {
            let base = name.strip_suffix(s)?;
            let kind = self.families.get(base)?;
            let allowed: &[&str] = match kind.as_str() {
                "counter" => &["_total", "_created"],
                "histogram" => &["_bucket", "_sum", "_count", "_created"],
                "gauge" | "unknown" => &[""],
                _ => &[],
            };
            allowed.contains(s).then_some(base)
        });
        match family {
            None => {
                let as_family = self.families.get(name).map(|kind| {
                    format!(" ({name} is a {kind} family: its series carry OpenMetrics' suffix for that type)")
                });
                Some(format!(
                    "{name}: no family of that name in the scrapes{}",
                    as_family.unwrap_or_default()
                ))
            }
            Some(_) if !self.samples.contains(name) => Some(format!(
                "{name}: declared, but the traffic of this test produced no sample of it"
            )),
            Some(_) => None,
        }
    }
}

/// Publish deduplication on for the traffic's topic, so its counter has a sample.
const DEDUP: &str = "[dedup.topics.deploy]\nwindow_s = 600\n";

/// Traffic that gives every family of the scrape a sample: a group with a lane, publishes
/// accepted and one refused, deliveries ACKed, one NACKed and redelivered.
fn make_traffic(s: &Server, group: &str, topic: &str) {
    s.subscribe(
        group,
        &json!({"topic": topic, "startFrom": "earliest", "ackTimeoutMs": 60000}),
    );
    let events: Vec<_> = (0..3)
        .map(|i| event(&format!("d{i}"), "deploy.test", json!({ "i": i })))
        .collect();
    published(&s.publish_batch(topic, &events), 3);
    published(
        &s.publish_structured(topic, &event("d3", "deploy.test", json!(3))),
        1,
    );
    // A repeat the dedup window ([`DEDUP`]) answers without appending: counted apart.
    let repeat = s.publish_structured(topic, &event("d0", "deploy.test", json!(0)));
    assert_eq!(
        repeat.expect(200).json()["results"][0]["duplicate"],
        json!(true)
    );
    // A refused publish (no `type`): counted by the request histogram, not as published.
    s.publish_structured(
        topic,
        &json!({"specversion": "1.0", "id": "x", "source": "/t"}),
    )
    .expect_error(400, "invalid-cloudevent");
    let got = s.poll_n(group, "c", 4, WAIT);
    let (nacked, acked) = got.split_at(1);
    s.nack(group, &[&nacked[0].id], Some(0)).all_ok(1);
    let ids: Vec<&str> = acked.iter().map(|d| d.id.as_str()).collect();
    s.ack(group, &ids).all_ok(3);
    let again = s.poll_n(group, "c", 1, WAIT);
    s.ack(group, &[&again[0].id]).all_ok(1);
}

#[test]
fn every_metric_the_dashboard_and_the_alert_rules_use_is_in_a_real_scrape() {
    let root = unimesh_tests::package_dir().join("..");
    let mut used: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for file in FILES {
        let path = root.join(file);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let names = names_in(&text);
        assert!(!names.is_empty(), "{file} names no unimesh_* metric");
        for name in names.into_keys() {
            used.entry(name).or_default().push(file);
        }
    }
    // The files use most of what unimesh exports; a scanner that found a handful would
    // check little.
    assert!(
        used.len() >= 25,
        "only {} names found in {FILES:?}: {used:?}",
        used.len()
    );

    let mut scrape = Scrape::default();
    let embedded = Server::start(Options::new().toml(DEDUP));
    make_traffic(&embedded, "dash", "deploy");
    scrape.add(&embedded.metrics());
    drop(embedded);

    let broker = Broker::start();
    let on_kafka = Server::start(broker.server_options("one", 1).toml(DEDUP));
    make_traffic(&on_kafka, "dash", "deploy");
    scrape.add(&on_kafka.metrics());

    let problems: Vec<String> = used
        .iter()
        .filter_map(|(name, files)| scrape.problem(name).map(|p| format!("{p} (in {files:?})")))
        .collect();
    assert!(
        problems.is_empty(),
        "metric names in deploy/ that unimesh does not export:\n{}\nexported samples: {:?}",
        problems.join("\n"),
        scrape.samples
    );
}

#[test]
fn the_name_scanner_and_the_suffix_rules_refuse_what_prometheus_would_not_store() {
    let names = names_in(
        r#"rate(unimesh_published_total{topic="a"}[5m]) / up{job="unimesh"} + x_unimesh_no + "deploy/README.md#unimeshlag" unimesh_lag"#,
    );
    assert_eq!(
        names.keys().collect::<Vec<_>>(),
        ["unimesh_lag", "unimesh_published_total"]
    );
    let mut s = Scrape::default();
    s.add(
        "# TYPE unimesh_published counter\nunimesh_published_total{topic=\"a\"} 1\n\
         # TYPE unimesh_lag gauge\nunimesh_lag{group=\"g\",partition=\"0\"} 0\n\
         # TYPE unimesh_publish_latency_seconds histogram\n\
         unimesh_publish_latency_seconds_bucket{le=\"+Inf\"} 1\n\
         unimesh_publish_latency_seconds_count 1\n# EOF\n",
    );
    assert_eq!(s.problem("unimesh_published_total"), None);
    assert_eq!(s.problem("unimesh_lag"), None);
    assert_eq!(s.problem("unimesh_publish_latency_seconds_bucket"), None);
    for wrong in [
        "unimesh_published",                   // a counter's series has _total
        "unimesh_lag_total",                   // a gauge has no suffix
        "unimesh_publish_latency_seconds",     // a histogram's series have suffixes
        "unimesh_publish_latency_seconds_sum", // declared, but no sample
        "unimesh_renamed_total",
    ] {
        assert!(s.problem(wrong).is_some(), "{wrong} should be refused");
    }
}
