//! The checker's own reading of a subscription filter (DESIGN.md §4, the HTTP API's
//! `filter`), written apart from the core's `Filter::matches` so a matcher bug cannot hide
//! behind itself.
//!
//! An event is read as a set of named attributes — `type`, `source`, `subject` when it
//! has one, and every extension, `partitionkey` among them — and a filter as a list of
//! conditions on attributes, each "equals" or "starts with". An event passes when every
//! condition finds its attribute and the attribute satisfies it; an absent attribute
//! satisfies no condition (not even "starts with the empty string"). No condition: every
//! event passes.

use unimesh_core::{EventMeta, Filter};

/// What one condition asks of an attribute's value.
enum Test<'a> {
    Equals(&'a str),
    StartsWith(&'a str),
}

impl Test<'_> {
    fn holds(&self, value: &str) -> bool {
        match *self {
            Test::Equals(want) => value == want,
            // Byte-wise: a prefix of the value's bytes (so a prefix ending inside a UTF-8
            // sequence matches nothing it should not, and nothing panics).
            Test::StartsWith(prefix) => {
                value.as_bytes().get(..prefix.len()) == Some(prefix.as_bytes())
            }
        }
    }
}

/// The conditions of a filter, as (attribute, test).
fn conditions(f: &Filter) -> Vec<(&str, Test<'_>)> {
    let exact = [
        ("type", &f.ty),
        ("source", &f.source),
        ("subject", &f.subject),
    ];
    let prefixes = [("type", &f.type_prefix), ("subject", &f.subject_prefix)];
    let mut out: Vec<(&str, Test<'_>)> = Vec::new();
    for (attr, v) in exact {
        if let Some(v) = v {
            out.push((attr, Test::Equals(v)));
        }
    }
    for (attr, v) in prefixes {
        if let Some(v) = v {
            out.push((attr, Test::StartsWith(v)));
        }
    }
    for (name, value) in &f.extensions {
        out.push((name.as_str(), Test::Equals(value)));
    }
    out
}

/// The value of one attribute of an event, if it has it.
fn attribute<'a>(m: &'a EventMeta, name: &str) -> Option<&'a str> {
    match name {
        "type" => Some(&m.ty),
        "source" => Some(&m.source),
        "subject" => m.subject.as_deref(),
        "partitionkey" => m.partition_key.as_deref(),
        other => m
            .extensions
            .iter()
            .find(|(k, _)| k == other)
            .map(|(_, v)| v.as_str()),
    }
}

/// Whether a group with filter `f` wants the event `m`.
pub fn admits(f: &Filter, m: &EventMeta) -> bool {
    conditions(f)
        .iter()
        .all(|(name, test)| attribute(m, name).is_some_and(|v| test.holds(v)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event() -> EventMeta {
        EventMeta {
            id: "e1".into(),
            source: "/shop/eu".into(),
            ty: "a.created".into(),
            subject: Some("eu/42".into()),
            partition_key: Some("k3".into()),
            extensions: vec![
                ("region".into(), "eu".into()),
                ("tier".into(), "gold".into()),
            ],
        }
    }

    #[test]
    fn every_condition_must_hold() {
        let m = event();
        let f = |g: fn(&mut Filter)| {
            let mut f = Filter::default();
            g(&mut f);
            admits(&f, &m)
        };
        assert!(f(|_| {}));
        assert!(f(|f| f.ty = Some("a.created".into())));
        assert!(!f(|f| f.ty = Some("a.create".into())));
        assert!(f(|f| f.type_prefix = Some("a.".into())));
        assert!(f(|f| f.type_prefix = Some(String::new())));
        assert!(!f(|f| f.type_prefix = Some("a.created.x".into())));
        assert!(f(|f| f.source = Some("/shop/eu".into())));
        assert!(!f(|f| f.source = Some("/shop".into())));
        assert!(f(|f| f.subject = Some("eu/42".into())));
        assert!(f(|f| f.subject_prefix = Some("eu/".into())));
        assert!(!f(|f| f.subject_prefix = Some("us/".into())));
        assert!(f(|f| f.extensions = vec![("tier".into(), "gold".into())]));
        assert!(f(
            |f| f.extensions = vec![("partitionkey".into(), "k3".into())]
        ));
        assert!(!f(
            |f| f.extensions = vec![("partitionkey".into(), "k4".into())]
        ));
        assert!(!f(|f| f.extensions = vec![("missing".into(), "x".into())]));
        assert!(!f(|f| {
            f.ty = Some("a.created".into());
            f.source = Some("/other".into());
        }));
    }

    /// Goal: the model and the core's matcher agree (a disagreement is a bug in one of
    /// them, and the simulation would report it as C7 or C1). Method: many random filters
    /// against many random events over small alphabets, so conditions often hold.
    #[test]
    fn agrees_with_the_cores_matcher_on_random_filters_and_events() {
        let mut rng = crate::rng::Rng::new(9);
        let words = ["", "a", "a.", "a.b", "eu", "eu/", "eu/1", "é", "éu", "k1"];
        let pick = |rng: &mut crate::rng::Rng| words[rng.index(words.len())].to_string();
        let maybe = |rng: &mut crate::rng::Rng| rng.chance(0.4).then(|| pick(rng));
        let some_of = |rng: &mut crate::rng::Rng, names: &[&str], p: f64| {
            let mut v: Vec<(String, String)> = Vec::new();
            for k in names {
                if rng.chance(p) {
                    v.push((k.to_string(), pick(rng)));
                }
            }
            v.sort();
            v
        };
        let mut agreed = [0u32; 2];
        for _ in 0..20_000 {
            let extensions = some_of(&mut rng, &["region", "tier"], 0.5);
            let m = EventMeta {
                id: "e".into(),
                source: pick(&mut rng),
                ty: pick(&mut rng),
                subject: maybe(&mut rng),
                partition_key: maybe(&mut rng),
                extensions,
            };
            let conditions = some_of(&mut rng, &["region", "tier", "partitionkey", "x"], 0.2);
            let f = Filter {
                ty: maybe(&mut rng),
                type_prefix: maybe(&mut rng),
                source: maybe(&mut rng),
                subject: maybe(&mut rng),
                subject_prefix: maybe(&mut rng),
                extensions: conditions,
            };
            let ours = admits(&f, &m);
            assert_eq!(ours, f.matches(&m), "{f:?} on {m:?}");
            agreed[usize::from(ours)] += 1;
        }
        assert!(
            agreed[0] > 100 && agreed[1] > 100,
            "both answers occur: {agreed:?}"
        );
    }

    #[test]
    fn an_absent_attribute_satisfies_nothing() {
        let mut m = event();
        m.subject = None;
        m.partition_key = None;
        let f = Filter {
            subject_prefix: Some(String::new()),
            ..Filter::default()
        };
        assert!(!admits(&f, &m));
        let f = Filter {
            extensions: vec![("partitionkey".into(), String::new())],
            ..Filter::default()
        };
        assert!(!admits(&f, &m));
    }
}
