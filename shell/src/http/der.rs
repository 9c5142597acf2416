//! The little DER reading the security code needs (issue 19), on bytes that may come from
//! outside (a client certificate's subject, a configured public key): every read is
//! bounded and a malformed input is `None`, never a panic.
//!
//! - [`common_name`]: the subject CN of a certificate (the caller's identity under mTLS),
//!   from the `Name` that `webpki` hands out.
//! - [`spki_key`]: the algorithm and the key bits of a `SubjectPublicKeyInfo` (a PEM
//!   `PUBLIC KEY`), which is what `jsonwebtoken`'s DER constructors want.

/// Universal tags used here.
const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const OID: u8 = 0x06;
const BIT_STRING: u8 = 0x03;
const UTF8_STRING: u8 = 0x0c;
const PRINTABLE_STRING: u8 = 0x13;
const IA5_STRING: u8 = 0x16;

/// The OID of `commonName` (2.5.4.3), its content bytes.
const CN: &[u8] = &[0x55, 0x04, 0x03];
/// rsaEncryption (1.2.840.113549.1.1.1).
const RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];
/// id-ecPublicKey (1.2.840.10045.2.1).
const EC: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
/// prime256v1 (1.2.840.10045.3.1.7).
const P256: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
/// Ed25519 (1.3.101.112).
const ED25519: &[u8] = &[0x2b, 0x65, 0x70];

/// One TLV off the front of `input`: (tag, content, rest). Only single-byte tags (all
/// that certificates' names and keys use) and definite lengths up to 4 bytes.
fn read(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    if tag & 0x1f == 0x1f {
        return None;
    }
    let (&first, mut rest) = rest.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let (bytes, after) = rest.split_at(n);
        rest = after;
        bytes
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b))
    };
    if rest.len() < len {
        return None;
    }
    let (content, after) = rest.split_at(len);
    Some((tag, content, after))
}

/// The TLV of `input` with this tag (and nothing after it).
fn only(input: &[u8], tag: u8) -> Option<&[u8]> {
    match read(input)? {
        (t, content, []) if t == tag => Some(content),
        _ => None,
    }
}

/// The first commonName of a `Name`'s content (the RDN sequence without its outer
/// `SEQUENCE`, as `webpki::Cert::subject` gives it), if it is a UTF-8, printable or IA5
/// string.
pub fn common_name(name: &[u8]) -> Option<String> {
    let mut rdns = name;
    while !rdns.is_empty() {
        let (tag, set, rest) = read(rdns)?;
        rdns = rest;
        if tag != SET {
            return None;
        }
        let mut attrs = set;
        while !attrs.is_empty() {
            let (tag, attr, rest) = read(attrs)?;
            attrs = rest;
            if tag != SEQUENCE {
                return None;
            }
            let (tag, oid, value) = read(attr)?;
            if tag != OID || oid != CN {
                continue;
            }
            let (tag, text, _) = read(value)?;
            if !matches!(tag, UTF8_STRING | PRINTABLE_STRING | IA5_STRING) {
                return None;
            }
            return std::str::from_utf8(text).ok().map(str::to_owned);
        }
    }
    None
}

/// The kind of a public key, by its SPKI algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyKind {
    Rsa,
    EcP256,
    Ed25519,
}

/// The algorithm and the key bits of a DER `SubjectPublicKeyInfo`: for RSA the PKCS#1
/// `RSAPublicKey`, for P-256 the uncompressed point, for Ed25519 the 32 bytes.
pub fn spki_key(spki: &[u8]) -> Option<(KeyKind, &[u8])> {
    let body = only(spki, SEQUENCE)?;
    let (tag, algorithm, rest) = read(body)?;
    if tag != SEQUENCE {
        return None;
    }
    let bits = only(rest, BIT_STRING)?;
    // The first byte counts the unused bits of the last one: always 0 for a key.
    let key = match bits.split_first()? {
        (0, key) => key,
        _ => return None,
    };
    let (tag, oid, params) = read(algorithm)?;
    if tag != OID {
        return None;
    }
    let kind = match oid {
        o if o == RSA => KeyKind::Rsa,
        o if o == ED25519 => KeyKind::Ed25519,
        o if o == EC => match read(params)? {
            (OID, curve, []) if curve == P256 => KeyKind::EcP256,
            _ => return None,
        },
        _ => return None,
    };
    Some((kind, key))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `CN=billing, O=Shop` as `openssl` writes a subject (two RDNs), without the outer
    /// SEQUENCE.
    const SUBJECT: &[u8] = &[
        0x31, 0x0d, 0x30, 0x0b, 0x06, 0x03, 0x55, 0x04, 0x0a, 0x0c, 0x04, b'S', b'h', b'o', b'p',
        0x31, 0x10, 0x30, 0x0e, 0x06, 0x03, 0x55, 0x04, 0x03, 0x0c, 0x07, b'b', b'i', b'l', b'l',
        b'i', b'n', b'g',
    ];

    #[test]
    fn the_common_name_is_found_among_the_rdns() {
        assert_eq!(common_name(SUBJECT), Some("billing".to_owned()));
        assert_eq!(common_name(&SUBJECT[..15]), None, "only O");
        assert_eq!(common_name(&[]), None);
    }

    #[test]
    fn malformed_names_are_none_not_panics() {
        for cut in 0..SUBJECT.len() {
            // A cut inside the CN's RDN is malformed; before it there is no CN.
            assert_eq!(common_name(&SUBJECT[..cut]), None, "cut at {cut}");
        }
        assert_eq!(common_name(&[0x31, 0x84, 0xff, 0xff, 0xff, 0xff]), None);
        assert_eq!(common_name(&[0x31, 0x85, 0, 0, 0, 0, 1]), None);
        assert_eq!(common_name(&[0x1f, 0x00]), None);
    }

    #[test]
    fn spki_keys_are_told_apart_by_their_algorithm() {
        // An Ed25519 public key as `openssl pkey -pubout -outform DER` writes it.
        let mut ed = vec![
            0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
        ];
        ed.extend([7u8; 32]);
        assert_eq!(spki_key(&ed), Some((KeyKind::Ed25519, &[7u8; 32][..])));
        let mut trailing = ed.clone();
        trailing.push(0);
        assert_eq!(spki_key(&trailing), None, "bytes after the SEQUENCE");
        for cut in 0..ed.len() {
            assert_eq!(spki_key(&ed[..cut]), None, "cut at {cut}");
        }
        let mut other = ed.clone();
        other[8] = 0x71; // Ed448
        assert_eq!(spki_key(&other), None);
    }
}
