//! The addresses `serve` listens on: `--host` is a comma-separated list, as llama-server b11434
//! reads it (`common/arg.cpp`), each address bound on `--port` (with port 0, the port the first
//! one got). Names resolve to their first address; with several addresses a wildcard `::`
//! binds IPv6 alone, so that `0.0.0.0,::` can share the port. `--reuse-port` lets other
//! processes bind the same port (SO_REUSEPORT). UNIX socket paths (`.sock`) are refused by name.

use std::net::SocketAddr;

use anyhow::{bail, Context, Result};
use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::TcpListener;

/// Connections a listener queues before `accept`.
const BACKLOG: i32 = 1024;

/// The addresses of a `--host` value: comma-separated, each trimmed, empty ones dropped.
pub fn hosts(value: &str) -> Result<Vec<String>> {
    let hosts: Vec<String> = value
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(str::to_owned)
        .collect();
    if hosts.is_empty() {
        bail!("--host requires at least one address");
    }
    if let Some(sock) = hosts.iter().find(|h| h.ends_with(".sock")) {
        bail!("--host {sock}: listening on a UNIX socket is not implemented (TCP addresses only)");
    }
    Ok(hosts)
}

/// Binds every address of `hosts` on `port` (shared with other sockets that ask for it when
/// `reuse_port`); returns each listener with its address.
pub async fn bind_all(
    hosts: &[String],
    mut port: u16,
    reuse_port: bool,
) -> Result<Vec<(TcpListener, SocketAddr)>> {
    let mut out = Vec::with_capacity(hosts.len());
    for host in hosts {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let addr = tokio::net::lookup_host((bare, port))
            .await
            .ok()
            .and_then(|mut a| a.next())
            .with_context(|| format!("--host {host}: not an address this machine resolves"))?;
        let v6_only = hosts.len() > 1 && addr.is_ipv6() && addr.ip().is_unspecified();
        let listener =
            bind(addr, v6_only, reuse_port).with_context(|| format!("listening on {addr}"))?;
        let bound = listener.local_addr()?;
        // Port 0 asks for any free port: the first address's port serves the rest too.
        port = bound.port();
        out.push((listener, bound));
    }
    Ok(out)
}

/// One listening socket, address reuse on as the standard library's listener has it.
fn bind(addr: SocketAddr, v6_only: bool, reuse_port: bool) -> Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if v6_only {
        socket.set_only_v6(true)?;
    }
    socket.set_reuse_address(true)?;
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    socket.set_nonblocking(true)?;
    Ok(TcpListener::from_std(socket.into())?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_list_splits_on_commas_and_refuses_what_it_cannot_bind() {
        assert_eq!(hosts(" 127.0.0.1, ::1 ,").unwrap(), ["127.0.0.1", "::1"]);
        assert!(hosts(" , ")
            .unwrap_err()
            .to_string()
            .contains("at least one"));
        assert!(hosts("127.0.0.1,/tmp/x.sock")
            .unwrap_err()
            .to_string()
            .contains("UNIX socket"));
    }

    #[tokio::test]
    async fn every_address_listens_on_the_port_the_first_one_got() {
        if std::net::TcpListener::bind("[::1]:0").is_err() {
            eprintln!("SKIPPED: this machine has no IPv6 loopback");
            return;
        }
        let all = bind_all(&hosts("127.0.0.1,::1").unwrap(), 0, false)
            .await
            .unwrap();
        assert_eq!(all.len(), 2);
        assert_ne!(all[0].1.port(), 0);
        assert!(all.iter().all(|(_, a)| a.port() == all[0].1.port()));
    }

    #[tokio::test]
    async fn with_reuse_port_a_second_listener_shares_the_port() {
        let host = hosts("127.0.0.1").unwrap();
        let first = bind_all(&host, 0, true).await.unwrap();
        let port = first[0].1.port();
        assert!(bind_all(&host, port, true).await.is_ok());
        let plain = bind_all(&host, 0, false).await.unwrap();
        assert!(bind_all(&host, plain[0].1.port(), false).await.is_err());
    }
}
