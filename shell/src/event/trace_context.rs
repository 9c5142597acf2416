//! The W3C trace context that the CloudEvents distributed-tracing extension carries
//! (`traceparent`, `tracestate`): read at publish (a malformed `traceparent` is refused,
//! DESIGN.md §8) and when a delivery, an ACK or a push names its event's trace.

use std::fmt;

/// The extension (and HTTP header) naming the event's trace and the span that published it.
pub const TRACEPARENT: &str = "traceparent";
/// Vendor data beside it; kept as written.
pub const TRACESTATE: &str = "tracestate";

/// A `traceparent` value: `VV-TTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTT-PPPPPPPPPPPPPPPP-FF`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub flags: u8,
}

/// Length of a version-00 `traceparent`; a later version may append `-` and more fields.
const LEN: usize = 55;

impl TraceParent {
    /// Parses a value as W3C Trace Context §3.2 says a receiver must: lower-case hex
    /// fields, version `ff` invalid, all-zero trace and span ids invalid, version 00
    /// exactly 55 characters, a later version read by its first four fields.
    pub fn parse(v: &str) -> Result<Self, String> {
        let b = v.as_bytes();
        if b.len() < LEN {
            return Err(format!(
                "must be a W3C traceparent (version-traceid-parentid-flags, {LEN} characters), \
                 not {} characters long",
                b.len()
            ));
        }
        if b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return Err(
                "must be a W3C traceparent: fields of 2, 32, 16 and 2 hex digits separated by '-'"
                    .to_owned(),
            );
        }
        let version = hex::<1>(&b[0..2]).ok_or_else(not_hex)?;
        let trace_id = hex::<16>(&b[3..35]).ok_or_else(not_hex)?;
        let span_id = hex::<8>(&b[36..52]).ok_or_else(not_hex)?;
        let flags = hex::<1>(&b[53..55]).ok_or_else(not_hex)?;
        if version[0] == 0xff {
            return Err("must be a W3C traceparent: version ff is invalid".to_owned());
        }
        if version[0] == 0 && b.len() != LEN {
            return Err(format!(
                "must be a W3C traceparent: version 00 is exactly {LEN} characters"
            ));
        }
        if b.len() > LEN && b[LEN] != b'-' {
            return Err("must be a W3C traceparent: a later version's fields follow a '-'".into());
        }
        if trace_id == [0; 16] {
            return Err("must be a W3C traceparent: the trace id is all zeros".to_owned());
        }
        if span_id == [0; 8] {
            return Err("must be a W3C traceparent: the parent id is all zeros".to_owned());
        }
        Ok(Self {
            trace_id,
            span_id,
            flags: flags[0],
        })
    }

    /// The trace id as 32 lower-case hex digits.
    pub fn trace_id_hex(&self) -> String {
        to_hex(&self.trace_id)
    }
}

/// The version-00 form (what the mesh sends on a push).
impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "00-{}-{}-{:02x}",
            to_hex(&self.trace_id),
            to_hex(&self.span_id),
            self.flags
        )
    }
}

fn not_hex() -> String {
    "must be a W3C traceparent: its fields are lower-case hex digits".to_owned()
}

/// `2 * N` lower-case hex digits as bytes.
fn hex<const N: usize>(digits: &[u8]) -> Option<[u8; N]> {
    let mut out = [0u8; N];
    if digits.len() != 2 * N {
        return None;
    }
    for (i, pair) in digits.chunks_exact(2).enumerate() {
        out[i] = (nibble(pair[0])? << 4) | nibble(pair[1])?;
    }
    Some(out)
}

fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

fn to_hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn a_w3c_traceparent_parses_and_prints_back() {
        let p = TraceParent::parse(GOOD).expect("valid");
        assert_eq!(p.trace_id_hex(), "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(p.span_id, [0xb7, 0xad, 0x6b, 0x71, 0x69, 0x20, 0x33, 0x31]);
        assert_eq!(p.flags, 1);
        assert_eq!(p.to_string(), GOOD);
        // A later version is read by its first four fields.
        let later = "cc-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-what-comes";
        assert_eq!(
            TraceParent::parse(later)
                .expect("later version")
                .to_string(),
            GOOD
        );
    }

    #[test]
    fn malformed_traceparents_are_refused_with_the_reason() {
        for (bad, why) in [
            ("00-abc-01", "55 characters"),
            ("", "55 characters"),
            (
                "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
                "lower-case hex",
            ),
            (
                "00_0af7651916cd43dd8448eb211c80319c_b7ad6b7169203331_01",
                "separated by '-'",
            ),
            (
                "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                "version ff",
            ),
            (
                "00-00000000000000000000000000000000-b7ad6b7169203331-01",
                "trace id is all zeros",
            ),
            (
                "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
                "parent id is all zeros",
            ),
            (
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-x",
                "exactly 55",
            ),
            (
                "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01x",
                "follow a '-'",
            ),
        ] {
            let e = TraceParent::parse(bad).expect_err(bad);
            assert!(e.contains(why), "{bad:?}: {e:?} should say {why:?}");
        }
    }
}
