//! Token buckets (governor's GCRA) per provider and per source address.

use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota, RateLimiter};
use http::{HeaderMap, HeaderName};

/// A bucket's size: `per_second` tokens refill it, `burst` is its depth.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    pub per_second: NonZeroU32,
    pub burst: NonZeroU32,
}

impl Rate {
    fn quota(self) -> Quota {
        Quota::per_second(self.per_second).allow_burst(self.burst)
    }
}

/// One provider's bucket.
pub struct ProviderLimit(DefaultDirectRateLimiter);

impl ProviderLimit {
    pub fn new(rate: Rate) -> Self {
        Self(RateLimiter::direct(rate.quota()))
    }

    /// `Err(wait)` when the bucket is empty.
    pub fn check(&self) -> Result<(), Duration> {
        self.0
            .check()
            .map_err(|not_until| not_until.wait_time_from(DefaultClock::default().now()))
    }
}

/// One bucket per source: an IPv4 address, or an IPv6 /64.
pub struct SourceLimit(DefaultKeyedRateLimiter<IpAddr>);

impl SourceLimit {
    pub fn new(rate: Rate) -> Self {
        Self(RateLimiter::keyed(rate.quota()))
    }

    pub fn check(&self, source: IpAddr) -> Result<(), Duration> {
        self.0
            .check_key(&bucket(source))
            .map_err(|not_until| not_until.wait_time_from(DefaultClock::default().now()))
    }

    /// Forgets buckets that are full again, so that the map of sources does
    /// not grow without bound under a spray of addresses.
    pub fn prune(&self) {
        self.0.retain_recent();
        self.0.shrink_to_fit();
    }
}

/// The bucket an address draws from. An IPv6 host is given a whole /64
/// (RFC 6177's smallest end-site assignment) and picks addresses within it
/// at will, so the /64 is the source; an IPv4 address written as IPv6
/// (`::ffff:a.b.c.d`) is that IPv4 address.
fn bucket(source: IpAddr) -> IpAddr {
    match source {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !u128::from(u64::MAX)).into()),
        },
        v4 => v4,
    }
}

/// The source of a request: the peer, or, behind a trusted ingress, the
/// last address in `client_ip_header` (the one the ingress itself saw; the
/// earlier entries are whatever the client claimed). The last entry of the
/// header's last line, as an ingress that adds a line of its own rather
/// than appending puts it there, with its port if it has one (Azure's
/// Application Gateway writes `ip:port`); an entry that is no address
/// (`unknown`) means the peer, never an earlier entry the client wrote.
pub fn source_ip(peer: IpAddr, headers: &HeaderMap, header: Option<&HeaderName>) -> IpAddr {
    header
        .and_then(|h| headers.get_all(h).iter().next_back())
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.rsplit(',').next())
        .map(str::trim)
        .and_then(|last| {
            last.parse()
                .ok()
                .or_else(|| last.parse::<SocketAddr>().ok().map(|a| a.ip()))
        })
        .unwrap_or(peer)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(per_second: u32, burst: u32) -> Rate {
        Rate {
            per_second: NonZeroU32::new(per_second).unwrap(),
            burst: NonZeroU32::new(burst).unwrap(),
        }
    }

    #[test]
    fn a_burst_passes_then_the_bucket_refuses_with_a_wait() {
        let limit = ProviderLimit::new(rate(1, 3));
        for _ in 0..3 {
            assert!(limit.check().is_ok());
        }
        let wait = limit.check().unwrap_err();
        assert!(wait > Duration::ZERO && wait <= Duration::from_secs(1));
    }

    #[test]
    fn sources_have_their_own_buckets() {
        let limit = SourceLimit::new(rate(1, 1));
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        assert!(limit.check(a).is_ok());
        assert!(limit.check(a).is_err());
        assert!(limit.check(b).is_ok());
    }

    #[test]
    fn the_trusted_header_names_the_source() {
        let peer: IpAddr = "127.0.0.1".parse().unwrap();
        let name = HeaderName::from_static("x-forwarded-for");
        let mut h = HeaderMap::new();
        assert_eq!(source_ip(peer, &h, Some(&name)), peer);
        h.insert(&name, "1.1.1.1, 203.0.113.7".parse().unwrap());
        assert_eq!(
            source_ip(peer, &h, Some(&name)),
            "203.0.113.7".parse::<IpAddr>().unwrap()
        );
        assert_eq!(source_ip(peer, &h, None), peer);
    }

    #[test]
    fn an_ipv6_source_is_its_slash_64() {
        let limit = SourceLimit::new(rate(1, 1));
        let ip = |text: &str| text.parse::<IpAddr>().unwrap();
        assert!(limit.check(ip("2001:db8:1:2::1")).is_ok());
        assert!(
            limit.check(ip("2001:db8:1:2:ffff:1:2:3")).is_err(),
            "the same /64"
        );
        assert!(limit.check(ip("2001:db8:1:3::1")).is_ok(), "another /64");
        assert!(limit.check(ip("192.0.2.1")).is_ok());
        assert!(
            limit.check(ip("::ffff:192.0.2.1")).is_err(),
            "the same IPv4 host"
        );
    }

    /// What the client wrote never names the source: not a first line
    /// before the ingress's own, nor an entry before one that does not
    /// parse.
    #[test]
    fn only_the_ingress_entry_names_the_source() {
        let peer: IpAddr = "10.0.0.9".parse().unwrap();
        let name = HeaderName::from_static("x-forwarded-for");
        let ingress: IpAddr = "203.0.113.7".parse().unwrap();
        let mut h = HeaderMap::new();
        h.append(&name, "198.51.100.23".parse().unwrap());
        h.append(&name, "203.0.113.7".parse().unwrap());
        assert_eq!(source_ip(peer, &h, Some(&name)), ingress, "the last line");
        for with_port in [
            "198.51.100.23, 203.0.113.7:443",
            "[2001:db8::1]:80, 203.0.113.7:8443",
        ] {
            h.insert(&name, with_port.parse().unwrap());
            assert_eq!(source_ip(peer, &h, Some(&name)), ingress, "{with_port}");
        }
        h.insert(&name, "198.51.100.23, [2001:db8::7]:443".parse().unwrap());
        assert_eq!(
            source_ip(peer, &h, Some(&name)),
            "2001:db8::7".parse::<IpAddr>().unwrap()
        );
        for unparsed in ["198.51.100.23, unknown", "198.51.100.23,"] {
            h.insert(&name, unparsed.parse().unwrap());
            assert_eq!(source_ip(peer, &h, Some(&name)), peer, "{unparsed}");
        }
    }
}
