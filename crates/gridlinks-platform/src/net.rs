//! Socket options every TCP transport applies to an accepted connection.

use std::time::Duration;

use tokio::net::TcpStream;

/// How often and how long TCP keepalive probes a silent peer (after `idle`).
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_PROBES: u32 = 3;

/// Socket options for an accepted connection: no Nagle delay (acks must not wait), and
/// TCP keepalive after `keepalive_idle` of silence (none when zero), so that a peer that
/// vanished without a FIN or RST is noticed within about `idle + 30 s`.
pub fn tune(stream: &TcpStream, keepalive_idle: Duration) {
    let _ = stream.set_nodelay(true);
    if !keepalive_idle.is_zero() {
        let ka = socket2::TcpKeepalive::new()
            .with_time(keepalive_idle)
            .with_interval(KEEPALIVE_INTERVAL)
            .with_retries(KEEPALIVE_PROBES);
        let _ = socket2::SockRef::from(stream).set_tcp_keepalive(&ka);
    }
}
