//! The operator's views and levers over the admin API: `groups`, `offsets`, `dlq browse`,
//! `dlq replay`, `seek`. Each prints a table or a sentence, or with `--json` the server's
//! objects.

use serde_json::{json, Value};

use super::client::{segment, Api, Client};
use super::table::Table;
use super::{print_json, print_line, DlqArgs, Failure, GroupsArgs, OffsetsArgs, SeekArgs};

/// A number member as text, `-` when absent.
fn num(v: &Value, key: &str) -> String {
    v.get(key)
        .and_then(Value::as_u64)
        .map_or_else(|| "-".to_owned(), |n| n.to_string())
}

/// A string member, `-` when absent.
fn text(v: &Value, key: &str) -> String {
    v.get(key)
        .and_then(Value::as_str)
        .map_or_else(|| "-".to_owned(), str::to_owned)
}

fn array<'a>(v: &'a Value, key: &str, what: &str) -> Result<&'a Vec<Value>, Failure> {
    v.get(key)
        .and_then(Value::as_array)
        .ok_or_else(|| Failure::Refused(format!("{what}: the answer has no {key} array")))
}

fn print_table(t: &Table, empty: &str) -> Result<(), Failure> {
    if t.is_empty() {
        print_line(empty)?;
        return Ok(());
    }
    for line in t.lines() {
        if !print_line(&line)? {
            break;
        }
    }
    Ok(())
}

fn subscriptions(client: &Client) -> Result<Vec<Value>, Failure> {
    let v = client.get(Api::Admin, "/admin/subscriptions")?.ok()?;
    Ok(array(&v, "subscriptions", "GET /admin/subscriptions")?.clone())
}

pub fn groups(a: &GroupsArgs) -> Result<(), Failure> {
    let client = Client::new(&a.common)?;
    let subs = subscriptions(&client)?;
    if a.common.json {
        return print_json(&Value::Array(subs));
    }
    let mut t = Table::new(vec![
        "GROUP",
        "TOPIC",
        "PARTITIONS",
        "LAG",
        "IN_FLIGHT",
        "CLIENTS",
        "DEAD_LETTERED",
        "PUSH",
    ]);
    for s in &subs {
        t.row(vec![
            text(s, "group"),
            text(s, "topic"),
            s.get("partitions")
                .and_then(Value::as_array)
                .map_or_else(|| "-".to_owned(), |p| p.len().to_string()),
            num(s, "lag"),
            num(s, "inFlight"),
            num(s, "clients"),
            s.get("stats")
                .map_or_else(|| "-".to_owned(), |st| num(st, "deadLettered")),
            s.get("push")
                .map_or_else(|| "-".to_owned(), |p| text(p, "url")),
        ]);
    }
    print_table(&t, "no subscription groups")
}

pub fn offsets(a: &OffsetsArgs) -> Result<(), Failure> {
    let client = Client::new(&a.common)?;
    let rows: Vec<Value> = match &a.topic {
        Some(topic) => {
            let path = format!("/admin/offsets?topic={}", segment(topic));
            let v = client.get(Api::Admin, &path)?.ok()?;
            array(&v, "offsets", &path)?.clone()
        }
        None => subscriptions(&client)?
            .iter()
            .filter_map(|s| s.get("partitions").and_then(Value::as_array))
            .flatten()
            .cloned()
            .collect(),
    };
    if a.common.json {
        return print_json(&Value::Array(rows));
    }
    let mut t = Table::new(vec![
        "GROUP",
        "TOPIC",
        "PARTITION",
        "WATERMARK",
        "IN_FLIGHT",
        "END",
        "LAG",
        "OWNER",
    ]);
    for r in &rows {
        t.row(vec![
            text(r, "group"),
            text(r, "topic"),
            num(r, "partition"),
            num(r, "watermark"),
            num(r, "inFlight"),
            num(r, "end"),
            num(r, "lag"),
            text(r, "owner"),
        ]);
    }
    print_table(&t, "no group reads a partition yet")
}

fn dlq_path(a: &DlqArgs, replay: bool) -> String {
    let mut path = format!("/admin/dlq/{}", segment(&a.group));
    if replay {
        path.push_str("/replay");
    }
    if let Some(max) = a.max {
        path.push_str(&format!("?max={max}"));
    }
    path
}

pub fn dlq_browse(a: &DlqArgs) -> Result<(), Failure> {
    let client = Client::new(&a.common)?;
    let path = dlq_path(a, false);
    let v = client.get(Api::Admin, &path)?.ok()?;
    let entries = array(&v, "entries", &path)?;
    if a.common.json {
        return print_json(&Value::Array(entries.clone()));
    }
    let mut t = Table::new(vec![
        "TOPIC",
        "PARTITION",
        "OFFSET",
        "ATTEMPTS",
        "REASON",
        "ID",
        "TYPE",
    ]);
    for e in entries {
        let event = e.get("event").unwrap_or(&Value::Null);
        t.row(vec![
            text(e, "topic"),
            num(e, "partition"),
            num(e, "offset"),
            num(e, "attempts"),
            text(e, "reason"),
            text(event, "id"),
            text(event, "type"),
        ]);
    }
    print_table(&t, &format!("no dead letters in {}", a.group))
}

pub fn dlq_replay(a: &DlqArgs) -> Result<(), Failure> {
    let client = Client::new(&a.common)?;
    let v = client
        .call(Api::Admin, "POST", &dlq_path(a, true), None)?
        .ok()?;
    if a.common.json {
        return print_json(&v);
    }
    let n = num(&v, "replayed");
    print_line(&format!(
        "{}: replay of {n} dead letter(s) started (delivered again to this group only)",
        a.group
    ))
    .map(|_| ())
}

pub fn seek(a: &SeekArgs) -> Result<(), Failure> {
    let client = Client::new(&a.common)?;
    let path = format!("/admin/subscriptions/{}/seek", segment(&a.group));
    let partitions = match a.partition {
        Some(p) => vec![p],
        // By time without a partition: every partition the group has.
        None => group_partitions(&client, &a.group)?,
    };
    let mut answers = Vec::new();
    for partition in partitions {
        let body = match (&a.time, a.to) {
            (Some(time), _) => json!({"partition": partition, "time": time}),
            (None, Some(offset)) => json!({"partition": partition, "offset": offset}),
            (None, None) => {
                return Err(Failure::Usage("give --to OFFSET or --time RFC3339".into()))
            }
        };
        let v = client.post_json(Api::Admin, &path, &body)?.ok()?;
        if !a.common.json {
            let at = a.time.as_ref().map_or_else(String::new, |t| {
                format!(" (the first event at or after {t})")
            });
            if !print_line(&format!(
                "{}: partition {} restarts at offset {}{at}",
                a.group,
                num(&v, "partition"),
                num(&v, "offset")
            ))? {
                return Ok(());
            }
        }
        answers.push(v);
    }
    if a.common.json {
        // One partition named: its answer; every partition: an array of them.
        return match (a.partition, answers.as_slice()) {
            (Some(_), [one]) => print_json(one),
            _ => print_json(&Value::Array(answers)),
        };
    }
    Ok(())
}

/// The partitions of a group, as `GET /admin/subscriptions` shows them (on Kafka: those
/// this instance serves).
fn group_partitions(client: &Client, group: &str) -> Result<Vec<u32>, Failure> {
    let subs = subscriptions(client)?;
    let found = subs
        .iter()
        .find(|s| s.get("group").and_then(Value::as_str) == Some(group))
        .ok_or_else(|| Failure::Refused(format!("no subscription group named {group}")))?;
    let mut partitions: Vec<u32> = found
        .get("partitions")
        .and_then(Value::as_array)
        .map(|rows| {
            rows.iter()
                .filter_map(|r| r.get("partition").and_then(Value::as_u64))
                .filter_map(|p| u32::try_from(p).ok())
                .collect()
        })
        .unwrap_or_default();
    partitions.sort_unstable();
    partitions.dedup();
    if partitions.is_empty() {
        return Err(Failure::Refused(format!(
            "group {group} reads no partition here yet"
        )));
    }
    Ok(partitions)
}
