//! Delivery ids: what a client names when it ACKs, NACKs or extends.
//!
//! An id is `epoch.lease.partition.offset.attempt` in decimal. Each part has a job:
//! - `epoch` makes ids unique across restarts: an ACK from a former incarnation can never
//!   acknowledge a delivery of this one (the seed restarted ids from zero);
//! - `lease` names one incarnation of one group's partition lane (fresh on subscribe,
//!   assignment and seek), so an ACK for a revoked or re-seeked lane is recognised;
//! - `partition`, `offset` and `attempt` locate the record and the try, so an ACK is resolved
//!   without any per-delivery memory: the lane's progress alone says whether it is done.

use std::fmt;
use std::str::FromStr;

use crate::types::{Epoch, Offset, Partition};

/// Longest text accepted by the parser. Five decimal `u64`s and four dots fit in 104 bytes;
/// anything longer is refused before any work is done on it.
pub const MAX_DELIVERY_ID_LEN: usize = 104;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct DeliveryId {
    pub epoch: Epoch,
    pub lease: u64,
    pub partition: Partition,
    pub offset: Offset,
    pub attempt: u32,
}

/// Why a delivery id could not be parsed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum DeliveryIdError {
    TooLong,
    WrongFieldCount,
    NotADecimalNumber { field: &'static str },
    OutOfRange { field: &'static str },
}

impl fmt::Display for DeliveryIdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeliveryIdError::TooLong => write!(f, "longer than {MAX_DELIVERY_ID_LEN} bytes"),
            DeliveryIdError::WrongFieldCount => {
                write!(f, "expected epoch.lease.partition.offset.attempt")
            }
            DeliveryIdError::NotADecimalNumber { field } => {
                write!(f, "{field} is not a decimal number")
            }
            DeliveryIdError::OutOfRange { field } => write!(f, "{field} is out of range"),
        }
    }
}

impl std::error::Error for DeliveryIdError {}

const FIELDS: [&str; 5] = ["epoch", "lease", "partition", "offset", "attempt"];

/// Parses one field strictly: ASCII digits only (no sign, no spaces), no leading zeros
/// except "0" itself, so every id has exactly one spelling and format/parse round-trips.
fn parse_field(s: &str, field: &'static str, max: u64) -> Result<u64, DeliveryIdError> {
    let bytes = s.as_bytes();
    if bytes.is_empty() || !bytes.iter().all(u8::is_ascii_digit) {
        return Err(DeliveryIdError::NotADecimalNumber { field });
    }
    if bytes.len() > 1 && bytes[0] == b'0' {
        return Err(DeliveryIdError::NotADecimalNumber { field });
    }
    let value: u64 = s
        .parse()
        .map_err(|_| DeliveryIdError::OutOfRange { field })?;
    if value > max {
        return Err(DeliveryIdError::OutOfRange { field });
    }
    Ok(value)
}

impl FromStr for DeliveryId {
    type Err = DeliveryIdError;

    fn from_str(s: &str) -> Result<Self, DeliveryIdError> {
        if s.len() > MAX_DELIVERY_ID_LEN {
            return Err(DeliveryIdError::TooLong);
        }
        let mut parts = [0u64; 5];
        let mut count = 0;
        for (i, part) in s.split('.').enumerate() {
            if i >= 5 {
                return Err(DeliveryIdError::WrongFieldCount);
            }
            let max = match i {
                0 | 2 | 4 => u64::from(u32::MAX),
                _ => u64::MAX,
            };
            parts[i] = parse_field(part, FIELDS[i], max)?;
            count += 1;
        }
        if count != 5 {
            return Err(DeliveryIdError::WrongFieldCount);
        }
        // The casts cannot truncate: parse_field bounded each u32 field by u32::MAX.
        Ok(DeliveryId {
            epoch: parts[0] as u32,
            lease: parts[1],
            partition: parts[2] as u32,
            offset: parts[3],
            attempt: parts[4] as u32,
        })
    }
}

impl fmt::Display for DeliveryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}.{}.{}.{}.{}",
            self.epoch, self.lease, self.partition, self.offset, self.attempt
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quickcheck::quickcheck;

    #[test]
    fn formats_and_parses_back() {
        let id = DeliveryId {
            epoch: 3,
            lease: 17,
            partition: 2,
            offset: 123_456,
            attempt: 1,
        };
        assert_eq!(id.to_string(), "3.17.2.123456.1");
        assert_eq!("3.17.2.123456.1".parse::<DeliveryId>(), Ok(id));
    }

    #[test]
    fn garbage_is_an_error_with_a_reason() {
        let cases: &[(&str, DeliveryIdError)] = &[
            ("", DeliveryIdError::NotADecimalNumber { field: "epoch" }),
            ("1.2.3.4", DeliveryIdError::WrongFieldCount),
            ("1.2.3.4.5.6", DeliveryIdError::WrongFieldCount),
            (
                "1.2.x.4.5",
                DeliveryIdError::NotADecimalNumber { field: "partition" },
            ),
            (
                "1.2.3.4.+5",
                DeliveryIdError::NotADecimalNumber { field: "attempt" },
            ),
            (
                "01.2.3.4.5",
                DeliveryIdError::NotADecimalNumber { field: "epoch" },
            ),
            (
                "4294967296.2.3.4.5",
                DeliveryIdError::OutOfRange { field: "epoch" },
            ),
            (
                "1.18446744073709551616.3.4.5",
                DeliveryIdError::OutOfRange { field: "lease" },
            ),
            (
                "1..3.4.5",
                DeliveryIdError::NotADecimalNumber { field: "lease" },
            ),
        ];
        for (text, want) in cases {
            assert_eq!(text.parse::<DeliveryId>(), Err(*want), "{text:?}");
        }
        let long = "1".repeat(MAX_DELIVERY_ID_LEN + 1);
        assert_eq!(long.parse::<DeliveryId>(), Err(DeliveryIdError::TooLong));
    }

    quickcheck! {
        fn round_trip(epoch: u32, lease: u64, partition: u32, offset: u64, attempt: u32) -> bool {
            let id = DeliveryId { epoch, lease, partition, offset, attempt };
            id.to_string().parse::<DeliveryId>() == Ok(id)
        }

        fn parse_never_panics(s: String) -> bool {
            // Either a clean error, or an id that formats back to the same text.
            match s.parse::<DeliveryId>() {
                Ok(id) => id.to_string() == s,
                Err(_) => true,
            }
        }
    }
}
