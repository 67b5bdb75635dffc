//! The HTTP listener: each connection served by hyper's HTTP/1 with the server's timeouts, and a
//! graceful stop. A client has `--idle-timeout` seconds to send a request's headers, which also
//! bounds how long a kept-alive connection may sit idle; a response write that makes no progress
//! for `--timeout` seconds (the client stopped reading) closes the connection, which cancels its
//! request. With TLS (`tls.rs`) the handshake must end within `--idle-timeout` seconds, and the
//! write deadline watches the socket under the encryption. (The body's own deadline is checked where it is read, `guard.rs`.)

use std::future::Future;
use std::io;
use std::pin::{pin, Pin};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Sleep;
use tokio_rustls::TlsAcceptor;

/// How long a connection may take.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    /// To send a request's headers, or to sit idle between requests.
    pub idle: Duration,
    /// For a write to make progress.
    pub write: Duration,
}

/// Serves `app` on every listener (over TLS when `tls` is given) until `stop` resolves; then
/// accepts no more connections, lets every request in flight finish (a connection closes after
/// its current response) and returns once all connections have closed.
pub async fn serve(
    listeners: Vec<TcpListener>,
    app: Router,
    timeouts: Timeouts,
    tls: Option<TlsAcceptor>,
    stop: impl Future<Output = ()>,
) {
    let (stopping_tx, stopping_rx) = watch::channel(false);
    // Every connection holds a receiver; `closed` resolves when the last one is gone.
    let (open_tx, open_rx) = watch::channel(());
    let mut stop = pin!(stop);
    loop {
        let accept =
            futures_util::future::select_all(listeners.iter().map(|l| Box::pin(l.accept())));
        let stream = tokio::select! {
            (accepted, _, _) = accept => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors, or a connection reset before it was accepted:
                    // keep serving the others.
                    tracing::warn!("accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let _ = stream.set_nodelay(true);
        let io = WriteDeadline::new(stream, timeouts.write);
        let service = TowerToHyperService::new(app.clone());
        let stopping = stopping_rx.clone();
        let open = open_rx.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            match tls {
                None => connection(TokioIo::new(io), service, timeouts.idle, stopping).await,
                // The handshake is held to the time a client has to send its headers.
                Some(acceptor) => match tokio::time::timeout(timeouts.idle, acceptor.accept(io))
                    .await
                {
                    Ok(Ok(stream)) => {
                        connection(TokioIo::new(stream), service, timeouts.idle, stopping).await;
                    }
                    Ok(Err(e)) => tracing::debug!("a TLS handshake failed: {e}"),
                    Err(_) => tracing::debug!("a TLS handshake timed out"),
                },
            }
            drop(open);
        });
    }
    drop(listeners);
    drop(open_rx);
    let _ = stopping_tx.send(true);
    open_tx.closed().await;
}

/// Serves one connection's requests until it closes; asks it to close after its current
/// response once `stopping` turns true.
async fn connection<I>(
    io: I,
    service: TowerToHyperService<Router>,
    idle: Duration,
    stopping: watch::Receiver<bool>,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let mut builder = http1::Builder::new();
    // Header names in Title-Case, as llama-server's HTTP library writes them (clients that keep
    // headers in a plain map, llama.cpp's own test utilities among them, look them up that way).
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(idle)
        .title_case_headers(true);
    let mut conn = pin!(builder.serve_connection(io, service));
    let mut stopping = pin!(wait_true(stopping));
    let mut asked = false;
    loop {
        tokio::select! {
            done = conn.as_mut() => {
                if let Err(e) = done {
                    tracing::debug!("a connection ended: {e}");
                }
                break;
            }
            () = &mut stopping, if !asked => {
                asked = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

/// Resolves once the value is true (or its sender is gone).
async fn wait_true(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|&v| v).await;
}

/// A TCP stream whose writes fail with `TimedOut` once one has made no progress for the
/// deadline. Reads are left alone: hyper reads while a response streams (to notice a client
/// that left), and a long generation is not a slow client.
struct WriteDeadline {
    stream: TcpStream,
    deadline: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
}

impl WriteDeadline {
    fn new(stream: TcpStream, deadline: Duration) -> Self {
        WriteDeadline {
            stream,
            deadline,
            stalled: None,
        }
    }

    /// After a write returned pending: starts the clock at the first stall, and fails once it
    /// has run out.
    fn poll_stall(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        let deadline = self.deadline;
        let sleep = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(deadline)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the client read nothing for {} s (-to/--timeout)",
                    deadline.as_secs()
                ),
            )),
            Poll::Pending => Poll::Pending,
        }
    }

    /// Maps a write's outcome: progress resets the clock, a stall runs it.
    fn timed<T>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match r {
            Poll::Ready(v) => {
                self.stalled = None;
                Poll::Ready(v)
            }
            Poll::Pending => self.poll_stall(cx).map(Err),
        }
    }
}

impl AsyncRead for WriteDeadline {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for WriteDeadline {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.timed(cx, r)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.timed(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.stream).poll_flush(cx);
        self.timed(cx, r)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.stream).poll_shutdown(cx);
        self.timed(cx, r)
    }
}
