//! Which librdkafka properties each client of the backend gets, and which the
//! configuration may not set: plain rules over the configuration's tables, no librdkafka.
//!
//! `[kafka.properties]` goes to every client; `[kafka.producer]` is laid over it for the
//! producer and the admin client (a producer-type handle in librdkafka), `[kafka.consumer]`
//! for every consumer. So a consumer setting such as `session.timeout.ms` no longer makes
//! the producer warn that it ignores it.

use std::collections::BTreeMap;

/// librdkafka properties the mesh sets itself, because the delivery contract depends on
/// them; no property table may name them.
pub const FIXED_PROPERTIES: &[&str] = &[
    "acks",
    "bootstrap.servers",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "enable.idempotence",
    "group.id",
    // From `kafka.instance` when `kafka.static_membership` is on: one id for every group
    // consumer of every instance would fence the instances off each other.
    "group.instance.id",
    "isolation.level",
];

/// The kind of librdkafka handle a client is, which picks the table laid over
/// `[kafka.properties]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientRole {
    /// Group consumers, the readers of the progress, subscriptions and DLQ topics, the
    /// leader-epoch probe.
    Consumer,
    /// The producer and the admin client.
    Producer,
}

/// The properties of `[kafka.properties]`, `[kafka.producer]` and `[kafka.consumer]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PropertyTables {
    pub common: BTreeMap<String, String>,
    pub producer: BTreeMap<String, String>,
    pub consumer: BTreeMap<String, String>,
}

impl PropertyTables {
    /// What a client of `role` is given: the common table, its role's table over it.
    pub fn for_role(&self, role: ClientRole) -> BTreeMap<String, String> {
        let mut out = self.common.clone();
        out.extend(
            self.role_table(role)
                .iter()
                .map(|(k, v)| (k.clone(), v.clone())),
        );
        out
    }

    /// Whether a client of `role` is given `name` (the mesh's defaults yield to it).
    pub fn sets(&self, role: ClientRole, name: &str) -> bool {
        self.common.contains_key(name) || self.role_table(role).contains_key(name)
    }

    fn role_table(&self, role: ClientRole) -> &BTreeMap<String, String> {
        match role {
            ClientRole::Consumer => &self.consumer,
            ClientRole::Producer => &self.producer,
        }
    }

    /// Every (dotted configuration key, property name, value) of the three tables, for
    /// checks that name the key of a bad one.
    pub fn entries(&self) -> impl Iterator<Item = (String, &str, &str)> {
        [
            ("kafka.properties", &self.common),
            ("kafka.producer", &self.producer),
            ("kafka.consumer", &self.consumer),
        ]
        .into_iter()
        .flat_map(|(table, t)| {
            t.iter()
                .map(move |(k, v)| (format!("{table}.{k}"), k.as_str(), v.as_str()))
        })
    }
}

/// The configuration's Kafka property rules: no table names a property the mesh sets
/// itself, and static membership (`static_membership`) has a stable instance name
/// (`instance`) to use. The error is the dotted key and why.
pub fn check_properties(
    tables: &PropertyTables,
    static_membership: bool,
    instance: &str,
) -> Result<(), (String, String)> {
    if let Some((key, _, _)) = tables
        .entries()
        .find(|(_, name, _)| FIXED_PROPERTIES.contains(name))
    {
        let why = if key.ends_with(".group.instance.id") {
            "is set by the mesh from kafka.instance (kafka.static_membership = true)"
        } else {
            "is set by the mesh (the delivery contract depends on it)"
        };
        return Err((key, why.to_owned()));
    }
    if static_membership && instance.trim().is_empty() {
        return Err((
            "kafka.static_membership".to_owned(),
            "needs kafka.instance: a name that stays the same across restarts and differs \
             between instances (flag --kafka-instance)"
                .to_owned(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// Goal: each client gets the common table with its own role's table over it, and
    /// nothing of the other role's. Method: one property in each table, one in two.
    #[test]
    fn each_role_gets_the_common_table_and_its_own_over_it() {
        let t = PropertyTables {
            common: table(&[("client.rack", "r1"), ("socket.timeout.ms", "3000")]),
            producer: table(&[("linger.ms", "5"), ("socket.timeout.ms", "4000")]),
            consumer: table(&[("session.timeout.ms", "10000")]),
        };
        let p = t.for_role(ClientRole::Producer);
        assert_eq!(
            p,
            table(&[
                ("client.rack", "r1"),
                ("linger.ms", "5"),
                ("socket.timeout.ms", "4000")
            ])
        );
        let c = t.for_role(ClientRole::Consumer);
        assert_eq!(
            c,
            table(&[
                ("client.rack", "r1"),
                ("session.timeout.ms", "10000"),
                ("socket.timeout.ms", "3000")
            ])
        );
        assert!(t.sets(ClientRole::Consumer, "session.timeout.ms"));
        assert!(!t.sets(ClientRole::Producer, "session.timeout.ms"));
        assert!(t.sets(ClientRole::Producer, "client.rack"));
    }

    /// Goal: a property the mesh sets is refused in every table, with the table's key
    /// named; static membership without an instance name is refused. Method: each case on
    /// the defaults.
    #[test]
    fn fixed_properties_and_static_membership_without_a_name_are_refused() {
        for table_name in ["properties", "producer", "consumer"] {
            for fixed in FIXED_PROPERTIES {
                let mut k = PropertyTables::default();
                let t = match table_name {
                    "properties" => &mut k.common,
                    "producer" => &mut k.producer,
                    _ => &mut k.consumer,
                };
                t.insert((*fixed).to_owned(), "x".to_owned());
                let (key, why) = check_properties(&k, false, "").expect_err("refused");
                assert_eq!(key, format!("kafka.{table_name}.{fixed}"));
                assert!(why.contains("set by the mesh"), "{why}");
            }
        }
        let k = PropertyTables::default();
        let (key, why) = check_properties(&k, true, " ").expect_err("refused");
        assert_eq!(key, "kafka.static_membership");
        assert!(why.contains("kafka.instance"), "{why}");
        assert_eq!(check_properties(&k, true, "edge-1"), Ok(()));
    }
}
