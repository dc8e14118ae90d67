//! What an MQTT connection runs over: plain TCP, TLS, or a WebSocket (MQTT over WebSocket,
//! subprotocol `mqtt`, binary messages carrying any slice of the MQTT byte stream).

use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::task::Poll;

use axum::extract::ws::{Message, WebSocket};
use bytes::BytesMut;
use gridlinks_listener::tls::{ClientCert, TlsStream};
use tokio::io::{AsyncRead, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

/// Bytes a read may add at a time (TCP).
const READ_CHUNK: usize = 4096;

/// A byte stream to the client.
pub trait Transport: Send + 'static {
    /// Waits for bytes and appends them to `buf` (allocating only once some are ready);
    /// false on end of stream or error. Cancel-safe.
    fn fill(&mut self, buf: &mut BytesMut) -> impl Future<Output = bool> + Send;
    /// Writes as much of `data` as can go without waiting; how much (0 when it would
    /// block, or when the transport cannot tell).
    fn try_write(&mut self, data: &[u8]) -> io::Result<usize>;
    /// Writes all of `data`.
    fn write_all(&mut self, data: &[u8]) -> impl Future<Output = io::Result<()>> + Send;
    /// Closes the stream.
    fn shutdown(&mut self) -> impl Future<Output = ()> + Send;
    /// The client's address, if known.
    fn peer_ip(&self) -> Option<IpAddr>;
    /// The certificate the client presented in its TLS handshake.
    fn client_cert(&self) -> Option<&ClientCert> {
        None
    }
}

impl Transport for TcpStream {
    // By polling (`poll_read_ready`, the socket's own waker slot) rather than awaiting
    // `readable()`: the future holds two references instead of a waiter node, and it is
    // alive in every idle connection's task (~180 bytes each).
    fn fill(&mut self, buf: &mut BytesMut) -> impl Future<Output = bool> + Send {
        std::future::poll_fn(move |cx| loop {
            match self.poll_read_ready(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(_)) => return Poll::Ready(false),
                Poll::Ready(Ok(())) => {}
            }
            buf.reserve(READ_CHUNK);
            match self.try_read_buf(buf) {
                Ok(0) => return Poll::Ready(false),
                Ok(_) => return Poll::Ready(true),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // Readiness was stale (it is after every read that did not drain the
                    // socket; the failed read cleared it): do not wait for the next bytes
                    // holding an empty 4 KiB buffer, or every idle connection keeps one.
                    if buf.is_empty() {
                        *buf = BytesMut::new();
                    }
                }
                Err(_) => return Poll::Ready(false),
            }
        })
    }

    fn try_write(&mut self, data: &[u8]) -> io::Result<usize> {
        match TcpStream::try_write(self, data) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
            r => r,
        }
    }

    async fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        AsyncWriteExt::write_all(self, data).await
    }

    async fn shutdown(&mut self) {
        let _ = AsyncWriteExt::shutdown(self).await;
    }

    fn peer_ip(&self) -> Option<IpAddr> {
        self.peer_addr().ok().map(|a| a.ip())
    }
}

/// MQTT over a WebSocket, the client's address, and over `wss://` the certificate it
/// presented.
pub struct Ws(pub WebSocket, pub Option<IpAddr>, pub Option<std::sync::Arc<ClientCert>>);

impl Transport for Ws {
    async fn fill(&mut self, buf: &mut BytesMut) -> bool {
        loop {
            match self.0.recv().await {
                Some(Ok(Message::Binary(b))) => {
                    buf.extend_from_slice(&b);
                    return true;
                }
                // Pings are answered by the WebSocket layer.
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                // MQTT is binary: a text message is a protocol error, like a close.
                _ => return false,
            }
        }
    }

    fn try_write(&mut self, _data: &[u8]) -> io::Result<usize> {
        // A message is sent whole, by `write_all`.
        Ok(0)
    }

    async fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        self.0.send(Message::Binary(bytes::Bytes::copy_from_slice(data))).await.map_err(io::Error::other)
    }

    async fn shutdown(&mut self) {
        let _ = self.0.send(Message::Close(None)).await;
    }

    fn peer_ip(&self) -> Option<IpAddr> {
        self.1
    }

    fn client_cert(&self) -> Option<&ClientCert> {
        self.2.as_deref()
    }
}

/// MQTT over TLS, and the certificate the client presented.
pub struct Tls(pub Box<TlsStream<TcpStream>>, pub Option<Box<ClientCert>>);

impl Transport for Tls {
    // Read through a buffer on the stack while polled, not held while waiting: an idle
    // connection keeps no read buffer of its own (rustls keeps its record buffers).
    fn fill(&mut self, buf: &mut BytesMut) -> impl Future<Output = bool> + Send {
        std::future::poll_fn(move |cx| {
            let mut chunk = [0u8; READ_CHUNK];
            let mut read = ReadBuf::new(&mut chunk);
            match std::pin::Pin::new(&mut *self.0).poll_read(cx, &mut read) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Ok(())) if !read.filled().is_empty() => {
                    buf.extend_from_slice(read.filled());
                    Poll::Ready(true)
                }
                Poll::Ready(_) => Poll::Ready(false),
            }
        })
    }

    fn try_write(&mut self, _data: &[u8]) -> io::Result<usize> {
        // What rustls takes may still wait in its buffer: everything goes by `write_all`,
        // which flushes.
        Ok(0)
    }

    async fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        self.0.write_all(data).await?;
        self.0.flush().await
    }

    async fn shutdown(&mut self) {
        let _ = self.0.shutdown().await;
    }

    fn peer_ip(&self) -> Option<IpAddr> {
        self.0.get_ref().0.peer_addr().ok().map(|a| a.ip())
    }

    fn client_cert(&self) -> Option<&ClientCert> {
        self.1.as_deref()
    }
}
