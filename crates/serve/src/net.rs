//! Addresses: listening, the loopback rule, and how a server names itself to others.

use crate::Error;
use llmr_node::agent::machine;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

/// Listens on `host:port` (port 0: a free one) at the first address `host` resolves to.
pub async fn bind(host: &str, port: u16) -> Result<tokio::net::TcpListener, Error> {
    let addr: SocketAddr = tokio::net::lookup_host((host, port))
        .await
        .map_err(|source| Error::Resolve { host: host.to_owned(), source })?
        .next()
        .ok_or_else(|| Error::NoAddress { host: host.to_owned() })?;
    tokio::net::TcpListener::bind(addr).await.map_err(|source| Error::Listen { addr, source })
}

/// `localhost` or a loopback address.
pub fn is_loopback(host: &str) -> bool {
    host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Where this process reaches its own server: the bound port on loopback when bound to every
/// address, else the bound address itself.
pub(crate) fn loopback_of(bound: SocketAddr) -> SocketAddr {
    match bound.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => SocketAddr::from(([127, 0, 0, 1], bound.port())),
        IpAddr::V6(ip) if ip.is_unspecified() => SocketAddr::from((Ipv6Addr::LOCALHOST, bound.port())),
        _ => bound,
    }
}

/// `http://<bound address>`, or the host name in place of an unspecified address (0.0.0.0).
pub(crate) fn advertised_url(bound: SocketAddr) -> String {
    if bound.ip().is_unspecified() {
        format!("http://{}:{}", machine::hostname(), bound.port())
    } else {
        format!("http://{bound}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_and_addresses() {
        assert!(is_loopback("localhost") && is_loopback("127.0.0.1") && is_loopback("::1"));
        assert!(!is_loopback("0.0.0.0") && !is_loopback("192.168.1.2") && !is_loopback("example.com"));
        assert_eq!(loopback_of("0.0.0.0:81".parse().unwrap()), "127.0.0.1:81".parse().unwrap());
        assert_eq!(loopback_of("[::]:81".parse().unwrap()), "[::1]:81".parse().unwrap());
        assert_eq!(loopback_of("10.0.0.1:81".parse().unwrap()), "10.0.0.1:81".parse().unwrap());
        assert_eq!(advertised_url("10.0.0.1:81".parse().unwrap()), "http://10.0.0.1:81");
    }
}
