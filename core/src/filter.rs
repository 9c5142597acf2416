//! Subscription filters on CloudEvent attributes. A record that does not match is done for
//! the group at once: it counts toward the watermark and is never delivered.

use crate::record::EventMeta;

/// Every present condition must hold (AND). An empty filter matches everything.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Filter {
    pub ty: Option<String>,
    pub type_prefix: Option<String>,
    pub source: Option<String>,
    pub subject: Option<String>,
    pub subject_prefix: Option<String>,
    /// Extension attributes that must be present with exactly these values, sorted by name.
    pub extensions: Vec<(String, String)>,
}

/// Bound on extension conditions per filter, so matching stays cheap per record.
pub const MAX_FILTER_EXTENSIONS: usize = 16;

impl Filter {
    pub fn is_empty(&self) -> bool {
        *self == Filter::default()
    }

    pub fn matches(&self, meta: &EventMeta) -> bool {
        if let Some(t) = &self.ty {
            if meta.ty != *t {
                return false;
            }
        }
        if let Some(p) = &self.type_prefix {
            if !meta.ty.starts_with(p.as_str()) {
                return false;
            }
        }
        if let Some(s) = &self.source {
            if meta.source != *s {
                return false;
            }
        }
        if let Some(s) = &self.subject {
            if meta.subject.as_deref() != Some(s.as_str()) {
                return false;
            }
        }
        if let Some(p) = &self.subject_prefix {
            match &meta.subject {
                Some(s) if s.starts_with(p.as_str()) => {}
                _ => return false,
            }
        }
        self.extensions
            .iter()
            .all(|(k, v)| meta.extension(k) == Some(v.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> EventMeta {
        EventMeta {
            id: "1".into(),
            source: "/shop".into(),
            ty: "order.created".into(),
            subject: Some("eu/42".into()),
            partition_key: None,
            extensions: vec![
                ("region".into(), "eu".into()),
                ("tier".into(), "gold".into()),
            ],
        }
    }

    #[test]
    fn empty_filter_matches_everything() {
        assert!(Filter::default().matches(&meta()));
    }

    #[test]
    fn each_condition_can_reject() {
        let m = meta();
        let yes = |f: Filter| assert!(f.matches(&m), "{f:?}");
        let no = |f: Filter| assert!(!f.matches(&m), "{f:?}");
        yes(Filter {
            ty: Some("order.created".into()),
            ..Default::default()
        });
        no(Filter {
            ty: Some("order".into()),
            ..Default::default()
        });
        yes(Filter {
            type_prefix: Some("order.".into()),
            ..Default::default()
        });
        no(Filter {
            type_prefix: Some("invoice.".into()),
            ..Default::default()
        });
        yes(Filter {
            source: Some("/shop".into()),
            ..Default::default()
        });
        no(Filter {
            source: Some("/shop/".into()),
            ..Default::default()
        });
        yes(Filter {
            subject: Some("eu/42".into()),
            ..Default::default()
        });
        no(Filter {
            subject: Some("eu".into()),
            ..Default::default()
        });
        yes(Filter {
            subject_prefix: Some("eu/".into()),
            ..Default::default()
        });
        no(Filter {
            subject_prefix: Some("us/".into()),
            ..Default::default()
        });
        yes(Filter {
            extensions: vec![("tier".into(), "gold".into())],
            ..Default::default()
        });
        no(Filter {
            extensions: vec![("tier".into(), "silver".into())],
            ..Default::default()
        });
        no(Filter {
            extensions: vec![("missing".into(), "x".into())],
            ..Default::default()
        });
    }

    #[test]
    fn partitionkey_is_an_extension_to_filters() {
        let mut m = meta();
        m.partition_key = Some("cust-7".into());
        let f = |v: &str| Filter {
            extensions: vec![("partitionkey".into(), v.into())],
            ..Default::default()
        };
        assert!(f("cust-7").matches(&m));
        assert!(!f("cust-8").matches(&m));
    }

    #[test]
    fn subject_conditions_reject_events_without_subject() {
        let mut m = meta();
        m.subject = None;
        assert!(!Filter {
            subject_prefix: Some("".into()),
            ..Default::default()
        }
        .matches(&m));
    }
}
