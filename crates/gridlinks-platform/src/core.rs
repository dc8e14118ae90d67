//! [`Core`]: configuration, storage, ingest, the tenant and the shared services, cheap to
//! clone; and [`Platform`], what every transport gets: the core with authentication, the
//! device-session registry, MQTT application credentials, the live fan-out and metrics.

use std::sync::Arc;

use gridlinks_ingest::Ingest;
use gridlinks_storage::{Store, WriterHandle};
use gridlinks_thingsboard::payload::PayloadLimits;
use uuid::Uuid;

use crate::auth::Auth;
use crate::broker_clients::Credentials;
use crate::config::Config;
use crate::live::Live;
use crate::metrics::Metrics;
use crate::sessions::DeviceSessions;

/// The core of the platform: the configuration, storage (reads, and the writer queue for
/// what is not device data), the ingest boundary and the tenant. Cheap to clone; a
/// subsystem keeps its own copy.
#[derive(Clone)]
pub struct Core {
    /// The configuration in force.
    pub cfg: Arc<Config>,
    /// Reads.
    pub store: Store,
    /// Telemetry reads and deletes: the node's store or a shared database (`cluster.timeseries`).
    pub ts: crate::cluster::TsStore,
    /// The shared services (Kafka, PostgreSQL) as last probed: while one is down, new work
    /// is refused.
    pub backends: Arc<crate::cluster::Backends>,
    /// Writes that are not device data (devices, deletes, broker rows): group commit.
    pub writer: WriterHandle,
    /// Device data in: credentials, batched durable submits, live fan-out.
    pub ingest: Ingest,
    /// The first tenant's id: the tenant of everything stored without one.
    pub tenant_id: Uuid,
    /// Devices' open claims.
    pub claims: Arc<crate::claims::Claims>,
    /// Throttles on credential-conflict answers and on provisioning.
    pub guards: Arc<crate::guards::Guards>,
    /// Live delivery across nodes (client publishes go to it; other nodes' come from it).
    pub bus: Option<Arc<gridlinks_kafka::Bus>>,
    /// Devices' activity, reported by every transport.
    pub activity: Arc<crate::activity::Activity>,
    /// Tenant profiles' limits in force.
    pub limits: Arc<crate::limits::Limits>,
    /// Every alarm, indexed.
    pub alarms: Arc<crate::alarms::Alarms>,
    /// Where alarm and device-activity events go to notify.
    pub notify: crate::notify::Sender,
}

impl Core {
    /// The tenant of an entity as storage keeps it (`None`: the first tenant).
    pub fn tenant_of(&self, stored: Option<Uuid>) -> Uuid {
        stored.unwrap_or(self.tenant_id)
    }

    /// A tenant as storage keeps it: the first one as `None`, as before tenants existed.
    pub fn stored_tenant(&self, tenant: Uuid) -> Option<Uuid> {
        (tenant != self.tenant_id).then_some(tenant)
    }

    /// The tenant of a document (its `tenantId`; none: the first tenant).
    pub fn doc_tenant(&self, d: &gridlinks_storage::DocRecord) -> Uuid {
        self.tenant_of(d.doc.get("tenantId").and_then(serde_json::Value::as_str).and_then(|t| t.parse().ok()))
    }

    /// Sets a document's tenant (a client's `tenantId` is never trusted).
    pub fn set_doc_tenant(&self, doc: &mut serde_json::Value, tenant: Uuid) {
        if let Some(o) = doc.as_object_mut() {
            match self.stored_tenant(tenant) {
                Some(t) => o.insert("tenantId".into(), t.to_string().into()),
                None => o.remove("tenantId"),
            };
        }
    }

    /// Commits one item a device sent, once counted against its tenant profile's rate
    /// limits; resolves after the durable commit.
    pub async fn submit_from_device(&self, item: gridlinks_ingest::Item) -> Result<(), gridlinks_ingest::IngestError> {
        self.limits.meter_item(&item)?;
        self.ingest.submit_one(item).await
    }

    /// Payload bounds from the configuration.
    pub fn payload_limits(&self) -> PayloadLimits {
        PayloadLimits {
            max_key_len: self.cfg.limits.max_key_len,
            max_values: self.cfg.limits.max_values_per_request,
            cast_strings: true,
        }
    }
}

/// What every transport stands on; one per server, shared as `Arc<Platform>`.
pub struct Platform {
    /// Configuration, storage, ingest, tenant, shared services.
    pub core: Core,
    /// Users, passwords, tokens, API keys and the password-check defences.
    pub auth: Arc<Auth>,
    /// Live device sessions of every transport: RPC, shared-attribute pushes, closing.
    pub devices: DeviceSessions,
    /// MQTT application credentials (clients that are not devices).
    pub clients: Credentials,
    /// Where committed data goes live (MQTT canonical topics, WebSocket subscriptions).
    pub live: Arc<Live>,
    /// Every subsystem's `/metrics`.
    pub metrics: Metrics,
    /// OTA packages' bytes in memory, for devices' chunk requests.
    pub ota: crate::entities::ota::DataCache,
    /// New device connections per source address (`mqtt.max_connects_per_address`), shared
    /// by every device listener; `None`: no bound.
    pub connect_rate: Option<crate::connect_rate::ConnectRate>,
    /// Data forwarding: tenants' sinks.
    pub forwarding: Arc<crate::forward::Forwarding>,
}
