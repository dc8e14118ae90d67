//! The HTTP transport's `/metrics`: refused payloads and connections, WebSocket API
//! sessions and subscriptions, device long polls.

use std::fmt;
use std::sync::Arc;

use gridlinks_platform::metrics::{counter, gauge, load, DescriptorEncoder, Source};

use crate::state::Status;
use crate::thingsboard::long_poll::LongPolls;
use crate::ws::Hub;

/// The HTTP side's counters.
pub struct HttpMetrics {
    /// Readiness and counters.
    pub status: Arc<Status>,
    /// WebSocket API subscriptions.
    pub ws: Arc<Hub>,
    /// HTTP devices' long polls.
    pub polls: Arc<LongPolls>,
}

impl Source for HttpMetrics {
    fn encode(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        counter(
            e,
            "gridlinks_payload_rejected_total",
            "Device payloads refused as malformed or over limits.",
            load(&self.status.payload_rejected),
        )?;
        counter(
            e,
            "gridlinks_http_over_limit_total",
            "HTTP connections refused at http.max_connections or http.max_connections_per_address, every connection in the way busy.",
            load(&self.status.http_over_limit),
        )?;
        gauge(e, "gridlinks_ws_sessions", "Open WebSocket API sessions (/api/ws).", self.ws.sessions() as u64)?;
        gauge(
            e,
            "gridlinks_ws_subscriptions",
            "WebSocket API subscriptions (an ENTITY_DATA page's devices count one each).",
            self.ws.subscriptions() as u64,
        )?;
        gauge(
            e,
            "gridlinks_http_long_polls",
            "HTTP device long polls waiting (GET /api/v1/{token}/rpc, .../attributes/updates).",
            self.polls.waiting() as u64,
        )
    }
}
