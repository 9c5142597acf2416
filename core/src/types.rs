//! The contract's vocabulary: topics, partitions, offsets, groups, clients, time.
//!
//! Names are cheap to clone (`Arc<str>`) because they travel in every effect; they are
//! validated once, at the edge, so the rest of the core can trust them.

use std::fmt;
use std::sync::Arc;

/// Milliseconds on the shell's monotonic clock. The core never reads a clock: every call
/// that needs time is given `now_ms`.
pub type Millis = u64;

/// A broker partition number. `u32::MAX` is reserved (the replay lane of a group).
pub type Partition = u32;

/// A broker's physical position of a record inside one partition.
pub type Offset = u64;

/// The process incarnation, persisted and incremented on every start.
pub type Epoch = u32;

/// Longest accepted topic, group or client name, in bytes.
pub const MAX_NAME_BYTES: usize = 200;

/// Why a name was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameError {
    pub kind: &'static str,
    pub reason: &'static str,
}

impl fmt::Display for NameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid {} name: {}", self.kind, self.reason)
    }
}

impl std::error::Error for NameError {}

/// Names appear in URLs, metrics labels and storage keys, so they are restricted to a
/// conservative alphabet: ASCII letters, digits, `.`, `_`, `-`. That keeps keys unambiguous
/// (no separator can appear inside a name) and labels free of escaping.
fn check_name(kind: &'static str, s: &str) -> Result<(), NameError> {
    if s.is_empty() {
        return Err(NameError {
            kind,
            reason: "must not be empty",
        });
    }
    if s.len() > MAX_NAME_BYTES {
        return Err(NameError {
            kind,
            reason: "longer than 200 bytes",
        });
    }
    if !s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
    {
        return Err(NameError {
            kind,
            reason: "only ASCII letters, digits, '.', '_' and '-' are allowed",
        });
    }
    Ok(())
}

macro_rules! name_type {
    ($(#[$doc:meta])* $name:ident, $kind:literal) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(Arc<str>);

        impl $name {
            /// Validates and wraps a name.
            pub fn new(s: &str) -> Result<Self, NameError> {
                check_name($kind, s)?;
                Ok(Self(Arc::from(s)))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:?})", stringify!($name), &*self.0)
            }
        }

        impl std::str::FromStr for $name {
            type Err = NameError;
            fn from_str(s: &str) -> Result<Self, NameError> {
                Self::new(s)
            }
        }
    };
}

name_type!(
    /// A topic: a named, partitioned log.
    TopicName,
    "topic"
);
name_type!(
    /// A subscription group: the unit of progress. Its clients compete for its records.
    GroupName,
    "group"
);
name_type!(
    /// A client of a group, as named by the client itself.
    ClientId,
    "client"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_accept_the_safe_alphabet() {
        assert_eq!(
            TopicName::new("orders.v1-eu_2").unwrap().as_str(),
            "orders.v1-eu_2"
        );
    }

    #[test]
    fn names_refuse_empty_long_and_unsafe() {
        assert!(GroupName::new("").is_err());
        assert!(GroupName::new(&"a".repeat(201)).is_err());
        assert!(GroupName::new(&"a".repeat(200)).is_ok());
        for bad in ["a/b", "a b", "é", "a\0", "a:b", "a%2F"] {
            let err = ClientId::new(bad).unwrap_err();
            assert_eq!(err.kind, "client", "{bad}");
        }
    }
}
