//! Where a webhook may push (issue 19): a subscription must not turn the mesh into a proxy
//! for the cloud metadata service, its own admin port or any other internal service.
//!
//! - With `push.allowed_hosts` empty (the default), only public addresses are targets: one
//!   on loopback, link-local (169.254.0.0/16, fe80::/10, where cloud metadata services
//!   live), private (10/8, 172.16/12, 192.168/16, fc00::/7), shared (100.64/10),
//!   unspecified, multicast, broadcast or reserved addresses is refused.
//! - With a list, exactly what it names is a target, public or not. Entries are host names
//!   (`hooks.internal`: whatever the name resolves to), IP addresses (`10.0.0.7`, `::1`)
//!   or CIDR blocks (`10.1.0.0/16`). An IPv4-mapped IPv6 address is judged as the IPv4
//!   address it maps.
//! - The mesh's own listeners are never a target, whatever the list says.
//! - Checked twice: when a subscription is written (IP literals and `localhost` names:
//!   [`TargetPolicy::check_url`]), and at push time after DNS resolution
//!   (`http::target::CheckedResolver`: the connection goes only to an address that passed, so a name
//!   that resolves to 169.254.169.254 at push time is refused then).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use ipnet::IpNet;

/// The checked form of `push.allowed_hosts`, plus the mesh's own listener addresses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TargetPolicy {
    /// Host names, lower case, without a trailing dot.
    names: Vec<String>,
    /// IP addresses (as /32 or /128) and CIDR blocks.
    nets: Vec<IpNet>,
    /// The mesh's own listeners: never a target.
    own: Vec<SocketAddr>,
}

/// Why a push target is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The host resolved to no address at all (a resolver failure is not a refusal).
    #[error("{host} resolves to no address")]
    NoAddress { host: String },
    /// Every address of the host is non-public (and there is no list).
    #[error("{ip} is a {kind} address, which push.allowed_hosts does not list")]
    NotPublic { ip: IpAddr, kind: &'static str },
    /// Not in the list (there is one).
    #[error("{ip} is not in push.allowed_hosts")]
    NotListed { ip: IpAddr },
    /// One of the mesh's own listeners.
    #[error("{addr} is one of this mesh's own listeners")]
    OwnListener { addr: SocketAddr },
    /// A host name not in the list (there is one).
    #[error("{host} is not in push.allowed_hosts")]
    NotListedName { host: String },
    /// Not a URL with a host.
    #[error("not a URL with a host")]
    Unparsable,
}

impl TargetPolicy {
    /// Parses `push.allowed_hosts` (comma-separated names, IPs and CIDR blocks). The error
    /// names the entry that is none of them.
    pub fn parse(allowed_hosts: &str) -> Result<Self, String> {
        let mut policy = TargetPolicy::default();
        for entry in allowed_hosts.split(',').map(str::trim) {
            if entry.is_empty() {
                continue;
            }
            if let Ok(net) = entry.parse::<IpNet>() {
                policy.nets.push(net.trunc());
                continue;
            }
            let bare = entry.trim_start_matches('[').trim_end_matches(']');
            if let Ok(ip) = bare.parse::<IpAddr>() {
                policy.nets.push(IpNet::from(ip));
                continue;
            }
            let name = entry.trim_end_matches('.').to_ascii_lowercase();
            let valid = !name.is_empty()
                && name.len() <= 253
                && name.split('.').all(|label| {
                    !label.is_empty()
                        && label.len() <= 63
                        && label
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                });
            if !valid {
                return Err(format!(
                    "{entry:?} is not a host name, an IP address or a CIDR block (10.0.0.0/8)"
                ));
            }
            policy.names.push(name);
        }
        Ok(policy)
    }

    /// The same policy, also refusing the mesh's own listeners.
    #[must_use]
    pub fn with_own(mut self, own: impl IntoIterator<Item = SocketAddr>) -> Self {
        self.own.extend(own);
        self
    }

    /// Whether `host` (a name) is listed.
    pub fn name_listed(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.');
        self.names.iter().any(|n| n.eq_ignore_ascii_case(host))
    }

    /// The check of one address the mesh would connect to. `listed`: the target's host name
    /// is in the list (then only the own-listener rule applies).
    pub fn check_addr(&self, addr: SocketAddr, listed: bool) -> Result<(), Refusal> {
        let ip = canonical(addr.ip());
        let own = self.own.iter().any(|o| {
            o.port() == addr.port()
                && (canonical(o.ip()) == ip
                    || (o.ip().is_unspecified() && (ip.is_loopback() || ip.is_unspecified()))
                    || (ip.is_unspecified() && o.ip().is_loopback()))
        });
        if own {
            return Err(Refusal::OwnListener { addr });
        }
        if listed || self.nets.iter().any(|n| n.contains(&ip)) {
            return Ok(());
        }
        if !self.is_empty() {
            return Err(Refusal::NotListed { ip });
        }
        match non_public(ip) {
            Some(kind) => Err(Refusal::NotPublic { ip, kind }),
            None => Ok(()),
        }
    }

    /// No list: every public address is a target.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty() && self.nets.is_empty()
    }

    /// A regular expression of the hosts a push URL may name, for the OpenAPI document, or
    /// `None` when any host may be named (no list) or the list has a CIDR block (which a
    /// pattern of host spellings cannot express).
    pub fn host_pattern(&self) -> Option<String> {
        if self.is_empty() {
            return None;
        }
        let mut hosts: Vec<String> = self.names.iter().map(|n| regex::escape(n)).collect();
        for net in &self.nets {
            if net.prefix_len() != net.max_prefix_len() {
                return None;
            }
            hosts.push(match net.addr() {
                IpAddr::V4(v4) => regex::escape(&v4.to_string()),
                IpAddr::V6(v6) => format!(r"\[{}\]", regex::escape(&v6.to_string())),
            });
        }
        Some(format!("(?:{})", hosts.join("|")))
    }

    /// The check when a subscription is written: an IP literal is judged now, a listed name
    /// passes, a `localhost` name is loopback, a name not in a list is refused, any other
    /// name waits for push time (DNS).
    pub fn check_url(&self, url: &str) -> Result<(), Refusal> {
        let Ok(uri) = url.parse::<http::Uri>() else {
            return Err(Refusal::Unparsable);
        };
        let Some(host) = uri.host() else {
            return Err(Refusal::Unparsable);
        };
        let port = uri
            .port_u16()
            .unwrap_or(if uri.scheme_str() == Some("https") {
                443
            } else {
                80
            });
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return self.check_addr(SocketAddr::new(ip, port), false);
        }
        let listed = self.name_listed(bare);
        let lower = bare.trim_end_matches('.').to_ascii_lowercase();
        if lower == "localhost" || lower.ends_with(".localhost") {
            // RFC 6761: always loopback, whatever a resolver says.
            return self.check_addr(
                SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port),
                listed,
            );
        }
        if listed || self.is_empty() {
            Ok(())
        } else {
            Err(Refusal::NotListedName {
                host: bare.to_owned(),
            })
        }
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it maps.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// What kind of non-public address `ip` is, or `None` for a public one.
fn non_public(ip: IpAddr) -> Option<&'static str> {
    match canonical(ip) {
        IpAddr::V4(v4) => non_public_v4(v4),
        IpAddr::V6(v6) => non_public_v6(v6),
    }
}

fn non_public_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = ip.octets();
    if ip.is_unspecified() || a == 0 {
        Some("unspecified")
    } else if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_link_local() {
        Some("link-local")
    } else if ip.is_private() {
        Some("private")
    } else if a == 100 && (64..128).contains(&b) {
        Some("shared (carrier-grade NAT)")
    } else if ip.is_broadcast() {
        Some("broadcast")
    } else if ip.is_multicast() {
        Some("multicast")
    } else if a >= 240 {
        Some("reserved")
    } else {
        None
    }
}

fn non_public_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let first = ip.segments()[0];
    if ip.is_unspecified() {
        Some("unspecified")
    } else if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_unicast_link_local() {
        Some("link-local")
    } else if ip.is_unique_local() || (first & 0xffc0) == 0xfec0 {
        Some("private")
    } else if ip.is_multicast() {
        Some("multicast")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().expect("a test address")
    }

    #[test]
    fn non_public_ranges_are_refused_by_default() {
        let p = TargetPolicy::parse("").expect("empty list");
        for (a, kind) in [
            ("169.254.169.254:80", "link-local"),
            ("127.0.0.1:9000", "loopback"),
            ("10.1.2.3:80", "private"),
            ("172.16.0.1:80", "private"),
            ("192.168.1.1:80", "private"),
            ("100.100.100.200:80", "shared (carrier-grade NAT)"),
            ("0.0.0.0:80", "unspecified"),
            ("224.0.0.1:80", "multicast"),
            ("255.255.255.255:80", "broadcast"),
            ("[::1]:80", "loopback"),
            ("[::]:80", "unspecified"),
            ("[fe80::1]:80", "link-local"),
            ("[fd00::1]:80", "private"),
            ("[ff02::1]:80", "multicast"),
            ("[::ffff:169.254.169.254]:80", "link-local"),
        ] {
            match p.check_addr(addr(a), false) {
                Err(Refusal::NotPublic { kind: k, .. }) => assert_eq!(k, kind, "{a}"),
                other => panic!("{a}: {other:?}"),
            }
        }
        for a in ["93.184.215.14:80", "[2606:4700::1111]:443", "172.32.0.1:80"] {
            assert_eq!(p.check_addr(addr(a), false), Ok(()), "{a}");
        }
    }

    #[test]
    fn the_list_allows_names_ips_and_blocks_but_never_the_own_listeners() {
        let p = TargetPolicy::parse(" hooks.internal , 127.0.0.1, [::1], 10.1.0.0/16 ")
            .expect("a valid list")
            .with_own([addr("127.0.0.1:8081"), addr("0.0.0.0:8080")]);
        assert_eq!(p.check_addr(addr("127.0.0.1:9000"), false), Ok(()));
        assert_eq!(p.check_addr(addr("[::1]:9000"), false), Ok(()));
        assert_eq!(p.check_addr(addr("10.1.200.3:80"), false), Ok(()));
        assert!(p.check_addr(addr("10.2.0.1:80"), false).is_err());
        assert_eq!(p.check_addr(addr("192.168.0.9:80"), true), Ok(()));
        // A list is exact: a public address it does not name is refused too.
        assert_eq!(
            p.check_addr(addr("93.184.215.14:80"), false),
            Err(Refusal::NotListed {
                ip: "93.184.215.14".parse().expect("an IP")
            })
        );
        assert!(p.check_url("http://hooks.internal:81/x").is_ok());
        assert!(p.check_url("http://elsewhere.example/x").is_err());
        assert_eq!(p.host_pattern(), None, "a CIDR block has no pattern");
        let pattern = TargetPolicy::parse("hooks.internal,::1,127.0.0.1")
            .expect("a list")
            .host_pattern()
            .expect("names and addresses have one");
        let re = regex::Regex::new(&format!("^{pattern}$")).expect("compiles");
        for host in ["hooks.internal", "[::1]", "127.0.0.1"] {
            assert!(re.is_match(host), "{host} {pattern}");
        }
        assert!(!re.is_match("127.0.0.2"));
        for own in [
            "127.0.0.1:8081",
            "127.0.0.1:8080",
            "[::ffff:127.0.0.1]:8081",
        ] {
            assert!(
                matches!(
                    p.check_addr(addr(own), true),
                    Err(Refusal::OwnListener { .. })
                ),
                "{own}"
            );
        }
        assert!(TargetPolicy::parse("a b").is_err());
        assert!(TargetPolicy::parse("10.0.0.0/40").is_err());
    }

    #[test]
    fn urls_are_judged_by_their_literal_or_wait_for_dns() {
        let p = TargetPolicy::parse("").expect("empty list");
        assert!(p
            .check_url("http://169.254.169.254/latest/meta-data/")
            .is_err());
        assert!(p.check_url("http://[::1]:9000/").is_err());
        assert!(p.check_url("http://localhost:9000/").is_err());
        assert!(p.check_url("http://api.LOCALHOST./").is_err());
        assert_eq!(p.check_url("http://hooks.example.com/x"), Ok(()));
        let listed = TargetPolicy::parse("localhost,::1").expect("a valid list");
        assert_eq!(listed.check_url("http://localhost:9000/"), Ok(()));
        assert_eq!(listed.check_url("http://[::1]:9000/"), Ok(()));
    }
}
