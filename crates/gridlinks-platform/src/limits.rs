//! Tenant profiles' limits in force: ThingsBoard's `DefaultTenantProfileConfiguration`
//! fields, read from each tenant's profile ([`TenantLimits`]) and enforced here.
//!
//! - Rate limits in ThingsBoard's syntax, `"100:1,2000:60"`: at most 100 per second and
//!   2000 per minute, each window a token bucket that starts full and refills evenly
//!   ([`RateLimit`]). Transport messages per tenant and per device ([`Limits::meter`]): a
//!   message carrying data points (telemetry, attributes) is counted against the
//!   `…TelemetryMsgRateLimit` and `…TelemetryDataPointsRateLimit` windows, any other
//!   message (RPC, attribute requests, claims, OTA chunks, gateway connects) against
//!   `…MsgRateLimit`, as ThingsBoard counts them. A gateway's message counts against the
//!   gateway. REST calls per tenant and per customer ([`Limits::rest`]).
//! - Counts: `maxDevices` (checked by the storage writer, so concurrent creations cannot
//!   both pass), `maxAssets`, `maxCustomers`, `maxUsers`, `maxDashboards`
//!   ([`Limits::may_create`]); WebSocket sessions and subscriptions per tenant and per
//!   customer ([`Limits::ws`]).
//!
//! A refusal names the field, its value and the profile; each is counted in `/metrics`
//! (`gridlinks_tenant_limit_refusals_total{limit="…"}`). The limits are kept per node: in a
//! cluster each node allows the full rate, as ThingsBoard's transports do, and reads the
//! profiles again every 10 s ([`follow`]).

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use gridlinks_ingest::{IngestError, Item};
use gridlinks_storage::{DocKind, Store, StoreError, TenantCaps};
use gridlinks_types::DeviceId;
use parking_lot::{Mutex, RwLock};
use serde_json::Value as J;
use uuid::Uuid;

use crate::auth::{Authority, Caller};
use crate::metrics::{self, DescriptorEncoder};

/// The id of the built-in default tenant profile (written at the first start).
pub fn default_profile_id() -> Uuid {
    Uuid::new_v5(&Uuid::NAMESPACE_OID, b"gridlinks default tenant profile")
}

/// A rate limit: windows of (at most `n`, per `secs` seconds).
#[derive(Clone, Debug, PartialEq)]
pub struct RateLimit {
    windows: Vec<(u64, u64)>,
}

impl RateLimit {
    /// Parses ThingsBoard's `"100:1,2000:60"`; an empty string is no limit (`None`).
    pub fn parse(text: &str) -> Result<Option<Self>, String> {
        let text = text.trim();
        if text.is_empty() {
            return Ok(None);
        }
        let mut windows = Vec::new();
        for part in text.split(',') {
            let window = part.split_once(':').and_then(|(n, secs)| {
                let (n, secs) = (n.trim().parse::<u64>().ok()?, secs.trim().parse::<u64>().ok()?);
                (n > 0 && secs > 0).then_some((n, secs))
            });
            windows.push(window.ok_or_else(|| {
                format!("invalid rate limit {text:?}: expected \"count:seconds\" pairs separated by commas, e.g. \"100:1,2000:60\"")
            })?);
        }
        if windows.len() > 8 {
            return Err(format!("invalid rate limit {text:?}: at most 8 windows"));
        }
        Ok(Some(Self { windows }))
    }
}

impl fmt::Display for RateLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (n, secs)) in self.windows.iter().enumerate() {
            write!(f, "{}{n}:{secs}", if i > 0 { "," } else { "" })?;
        }
        Ok(())
    }
}

/// The state of one [`RateLimit`]: a token bucket per window, as of `at`.
#[derive(Debug)]
struct Buckets {
    tokens: Vec<f64>,
    at: Instant,
}

impl Buckets {
    fn full(limit: &RateLimit, now: Instant) -> Self {
        Self { tokens: limit.windows.iter().map(|(n, _)| *n as f64).collect(), at: now }
    }

    fn refill(&mut self, limit: &RateLimit, now: Instant) {
        // Callers read the clock before taking the lock: an instant older than the last
        // one adds nothing (and does not move the clock back, to be credited again).
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = self.at.max(now);
        for (t, (n, secs)) in self.tokens.iter_mut().zip(&limit.windows) {
            *t = (*t + dt * *n as f64 / *secs as f64).min(*n as f64);
        }
    }

    /// Whether `cost` is available in every window (nothing taken).
    fn has(&self, cost: f64) -> bool {
        self.tokens.iter().all(|t| *t >= cost)
    }

    fn take(&mut self, cost: f64) {
        self.tokens.iter_mut().for_each(|t| *t -= cost);
    }
}

/// The limits a profile field sets, as named in refusals and in `/metrics`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// `transportTenantMsgRateLimit`.
    TenantMsg,
    /// `transportTenantTelemetryMsgRateLimit`.
    TenantTelemetryMsg,
    /// `transportTenantTelemetryDataPointsRateLimit`.
    TenantDataPoints,
    /// `transportDeviceMsgRateLimit`.
    DeviceMsg,
    /// `transportDeviceTelemetryMsgRateLimit`.
    DeviceTelemetryMsg,
    /// `transportDeviceTelemetryDataPointsRateLimit`.
    DeviceDataPoints,
    /// `transportGatewayMsgRateLimit`: what a gateway sends for its devices (`v1/gateway/…`).
    GatewayMsg,
    /// `transportGatewayTelemetryMsgRateLimit`.
    GatewayTelemetryMsg,
    /// `transportGatewayTelemetryDataPointsRateLimit`.
    GatewayDataPoints,
    /// `transportGatewayDeviceMsgRateLimit`: a gateway's own messages as a device
    /// (`v1/devices/me/…`), in place of the device limits.
    GatewayDeviceMsg,
    /// `transportGatewayDeviceTelemetryMsgRateLimit`.
    GatewayDeviceTelemetryMsg,
    /// `transportGatewayDeviceTelemetryDataPointsRateLimit`.
    GatewayDeviceDataPoints,
    /// `tenantServerRestLimitsConfiguration`.
    TenantRest,
    /// `customerServerRestLimitsConfiguration`.
    CustomerRest,
    /// `maxDevices`.
    MaxDevices,
    /// `maxAssets`.
    MaxAssets,
    /// `maxCustomers`.
    MaxCustomers,
    /// `maxUsers`.
    MaxUsers,
    /// `maxDashboards`.
    MaxDashboards,
    /// `maxWsSessionsPerTenant`.
    WsSessionsPerTenant,
    /// `maxWsSessionsPerCustomer`.
    WsSessionsPerCustomer,
    /// `maxWsSubscriptionsPerTenant`.
    WsSubscriptionsPerTenant,
    /// `maxWsSubscriptionsPerCustomer`.
    WsSubscriptionsPerCustomer,
    /// `maxWsSessionsPerRegularUser`.
    WsSessionsPerUser,
    /// `maxWsSubscriptionsPerRegularUser`.
    WsSubscriptionsPerUser,
}

impl Limit {
    const ALL: [Limit; 25] = [
        Limit::TenantMsg,
        Limit::TenantTelemetryMsg,
        Limit::TenantDataPoints,
        Limit::DeviceMsg,
        Limit::DeviceTelemetryMsg,
        Limit::DeviceDataPoints,
        Limit::GatewayMsg,
        Limit::GatewayTelemetryMsg,
        Limit::GatewayDataPoints,
        Limit::GatewayDeviceMsg,
        Limit::GatewayDeviceTelemetryMsg,
        Limit::GatewayDeviceDataPoints,
        Limit::TenantRest,
        Limit::CustomerRest,
        Limit::MaxDevices,
        Limit::MaxAssets,
        Limit::MaxCustomers,
        Limit::MaxUsers,
        Limit::MaxDashboards,
        Limit::WsSessionsPerTenant,
        Limit::WsSessionsPerCustomer,
        Limit::WsSubscriptionsPerTenant,
        Limit::WsSubscriptionsPerCustomer,
        Limit::WsSessionsPerUser,
        Limit::WsSubscriptionsPerUser,
    ];

    /// The tenant profile configuration's field.
    pub fn field(self) -> &'static str {
        match self {
            Limit::TenantMsg => "transportTenantMsgRateLimit",
            Limit::TenantTelemetryMsg => "transportTenantTelemetryMsgRateLimit",
            Limit::TenantDataPoints => "transportTenantTelemetryDataPointsRateLimit",
            Limit::DeviceMsg => "transportDeviceMsgRateLimit",
            Limit::DeviceTelemetryMsg => "transportDeviceTelemetryMsgRateLimit",
            Limit::DeviceDataPoints => "transportDeviceTelemetryDataPointsRateLimit",
            Limit::GatewayMsg => "transportGatewayMsgRateLimit",
            Limit::GatewayTelemetryMsg => "transportGatewayTelemetryMsgRateLimit",
            Limit::GatewayDataPoints => "transportGatewayTelemetryDataPointsRateLimit",
            Limit::GatewayDeviceMsg => "transportGatewayDeviceMsgRateLimit",
            Limit::GatewayDeviceTelemetryMsg => "transportGatewayDeviceTelemetryMsgRateLimit",
            Limit::GatewayDeviceDataPoints => "transportGatewayDeviceTelemetryDataPointsRateLimit",
            Limit::TenantRest => "tenantServerRestLimitsConfiguration",
            Limit::CustomerRest => "customerServerRestLimitsConfiguration",
            Limit::MaxDevices => "maxDevices",
            Limit::MaxAssets => "maxAssets",
            Limit::MaxCustomers => "maxCustomers",
            Limit::MaxUsers => "maxUsers",
            Limit::MaxDashboards => "maxDashboards",
            Limit::WsSessionsPerTenant => "maxWsSessionsPerTenant",
            Limit::WsSessionsPerCustomer => "maxWsSessionsPerCustomer",
            Limit::WsSubscriptionsPerTenant => "maxWsSubscriptionsPerTenant",
            Limit::WsSubscriptionsPerCustomer => "maxWsSubscriptionsPerCustomer",
            Limit::WsSessionsPerUser => "maxWsSessionsPerRegularUser",
            Limit::WsSubscriptionsPerUser => "maxWsSubscriptionsPerRegularUser",
        }
    }

    /// Whether it bounds devices' messages.
    fn is_transport(self) -> bool {
        matches!(
            self,
            Limit::TenantMsg
                | Limit::TenantTelemetryMsg
                | Limit::TenantDataPoints
                | Limit::DeviceMsg
                | Limit::DeviceTelemetryMsg
                | Limit::DeviceDataPoints
                | Limit::GatewayMsg
                | Limit::GatewayTelemetryMsg
                | Limit::GatewayDataPoints
                | Limit::GatewayDeviceMsg
                | Limit::GatewayDeviceTelemetryMsg
                | Limit::GatewayDeviceDataPoints
        )
    }

    /// Whether it is a rate (`"count:seconds,…"`) rather than a count.
    fn is_rate(self) -> bool {
        self.is_transport() || matches!(self, Limit::TenantRest | Limit::CustomerRest)
    }

    /// What it counts, in a refusal.
    fn counts(self) -> &'static str {
        match self {
            Limit::TenantMsg => "messages of this tenant's devices",
            Limit::TenantTelemetryMsg => "telemetry messages of this tenant's devices",
            Limit::TenantDataPoints => "data points of this tenant's devices",
            Limit::DeviceMsg => "messages of this device",
            Limit::DeviceTelemetryMsg => "telemetry messages of this device",
            Limit::DeviceDataPoints => "data points of this device",
            Limit::GatewayMsg => "messages this gateway sends for its devices",
            Limit::GatewayTelemetryMsg => "telemetry messages this gateway sends for its devices",
            Limit::GatewayDataPoints => "data points this gateway sends for its devices",
            Limit::GatewayDeviceMsg => "messages of this gateway",
            Limit::GatewayDeviceTelemetryMsg => "telemetry messages of this gateway",
            Limit::GatewayDeviceDataPoints => "data points of this gateway",
            Limit::TenantRest => "REST API calls of this tenant",
            Limit::CustomerRest => "REST API calls of this customer",
            Limit::MaxDevices => "devices",
            Limit::MaxAssets => "assets",
            Limit::MaxCustomers => "customers",
            Limit::MaxUsers => "users",
            Limit::MaxDashboards => "dashboards",
            Limit::WsSessionsPerTenant => "WebSocket sessions of this tenant",
            Limit::WsSessionsPerCustomer => "WebSocket sessions of this customer",
            Limit::WsSubscriptionsPerTenant => "WebSocket subscriptions of this tenant",
            Limit::WsSubscriptionsPerCustomer => "WebSocket subscriptions of this customer",
            Limit::WsSessionsPerUser => "WebSocket sessions of this user",
            Limit::WsSubscriptionsPerUser => "WebSocket subscriptions of this user",
        }
    }
}

/// One tenant profile's limits (0 or no rate: no bound).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TenantLimits {
    /// The profile's name, for refusals.
    pub profile: String,
    rates: HashMap<&'static str, RateLimit>,
    counts: HashMap<&'static str, u64>,
    /// Each rate limit's refusal, written once.
    refusals: HashMap<&'static str, String>,
}

impl TenantLimits {
    /// The limits of a tenant profile document (`profileData.configuration`); an invalid
    /// rate limit is an error naming its field.
    pub fn from_profile(name: &str, doc: &J) -> Result<Self, String> {
        let cfg = doc.pointer("/profileData/configuration").cloned().unwrap_or(J::Null);
        let mut out = Self { profile: name.to_owned(), ..Self::default() };
        for limit in Limit::ALL {
            let Some(v) = cfg.get(limit.field()).filter(|v| !v.is_null()) else { continue };
            match v {
                J::String(s) if limit.is_rate() => {
                    if let Some(r) = RateLimit::parse(s).map_err(|e| format!("{}: {e}", limit.field()))? {
                        out.refusals.insert(limit.field(), out.refusal(limit, &format_args!("\"{r}\"")));
                        out.rates.insert(limit.field(), r);
                    }
                }
                J::Number(n) if !limit.is_rate() => {
                    let n = n
                        .as_u64()
                        .ok_or_else(|| format!("{}: a whole number ≥ 0, or 0 for no limit", limit.field()))?;
                    if n > 0 {
                        out.counts.insert(limit.field(), n);
                    }
                }
                _ => {
                    let want = if limit.is_rate() { "a string like \"100:1,2000:60\"" } else { "a number" };
                    return Err(format!("{}: expected {want}", limit.field()));
                }
            }
        }
        Ok(out)
    }

    /// Whether nothing is bounded.
    fn is_empty(&self) -> bool {
        self.rates.is_empty() && self.counts.is_empty()
    }

    fn rate(&self, l: Limit) -> Option<&RateLimit> {
        self.rates.get(l.field())
    }

    /// The bound set by `l` (0: none).
    pub fn count(&self, l: Limit) -> u64 {
        self.counts.get(l.field()).copied().unwrap_or(0)
    }

    fn has_transport_rates(&self) -> bool {
        Limit::ALL.into_iter().any(|l| l.is_transport() && self.rate(l).is_some())
    }

    fn refusal(&self, l: Limit, value: &dyn fmt::Display) -> String {
        format!("{} limit of tenant profile '{}' reached: {} = {value}", l.counts(), self.profile, l.field())
    }
}

/// Rate-limit state of one tenant, device or customer under `limits`.
struct Metered {
    /// The limits the state was made for (a changed profile starts afresh).
    limits: Arc<TenantLimits>,
    /// Per limit field, its buckets.
    buckets: HashMap<&'static str, Buckets>,
}

impl Metered {
    fn new(limits: Arc<TenantLimits>) -> Self {
        Self { limits, buckets: HashMap::new() }
    }

    /// Whether `l` has a token now (nothing taken).
    fn has_token(&mut self, l: Limit, now: Instant) -> bool {
        let Some(rate) = self.limits.rate(l) else { return true };
        let b = self.buckets.entry(l.field()).or_insert_with(|| Buckets::full(rate, now));
        b.refill(rate, now);
        b.has(1.0)
    }

    /// Takes `cost` from each of `want` (limit, cost) at once, or nothing: the first
    /// limit that lacks it.
    fn take(&mut self, want: &[(Limit, f64)], now: Instant) -> Result<(), Limit> {
        for &(l, cost) in want {
            let Some(rate) = self.limits.rate(l) else { continue };
            let b = self.buckets.entry(l.field()).or_insert_with(|| Buckets::full(rate, now));
            b.refill(rate, now);
            if !b.has(cost) {
                return Err(l);
            }
        }
        for &(l, cost) in want {
            if let Some(b) = self.buckets.get_mut(l.field()) {
                b.take(cost);
            }
        }
        Ok(())
    }

    fn give_back(&mut self, want: &[(Limit, f64)]) {
        for &(l, cost) in want {
            if let Some(b) = self.buckets.get_mut(l.field()) {
                b.take(-cost);
            }
        }
    }
}

/// Most devices whose tenant is remembered for metering; past it the table starts afresh.
const MAX_DEVICES: usize = 1 << 21;

/// What metering remembers of a device.
struct DeviceState {
    tenant: Uuid,
    /// A gateway's own messages count against the `transportGatewayDevice…` limits.
    gateway: bool,
    /// Its rate state (once it has some under its tenant's limits).
    metered: Option<Metered>,
}

/// How a message is counted, besides against its tenant: a device's own (a gateway's own,
/// as ThingsBoard counts them, against the gateway-device limits), or one a gateway sends
/// for its devices (`v1/gateway/…`, against the gateway limits).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sent {
    Own,
    ForDevices,
}

impl Sent {
    /// The (messages, telemetry messages, data points) limits of the sender.
    fn limits(self, gateway: bool) -> [Limit; 3] {
        match (self, gateway) {
            (Sent::ForDevices, _) => [Limit::GatewayMsg, Limit::GatewayTelemetryMsg, Limit::GatewayDataPoints],
            (Sent::Own, true) => {
                [Limit::GatewayDeviceMsg, Limit::GatewayDeviceTelemetryMsg, Limit::GatewayDeviceDataPoints]
            }
            (Sent::Own, false) => [Limit::DeviceMsg, Limit::DeviceTelemetryMsg, Limit::DeviceDataPoints],
        }
    }
}

/// The limits in force and their state, one per server.
pub struct Limits {
    store: Store,
    first_tenant: Uuid,
    /// Tenants whose profile bounds something.
    by_tenant: RwLock<HashMap<Uuid, Arc<TenantLimits>>>,
    /// Whether any tenant has transport rate limits (else metering is one load).
    transport: AtomicBool,
    /// Tenants' and customers' rate state (transport, REST).
    owners: Mutex<HashMap<Uuid, Metered>>,
    /// Devices' tenants and rate state.
    devices: Mutex<HashMap<DeviceId, DeviceState>>,
    /// What the storage writer checks `maxDevices` against.
    device_caps: Arc<TenantCaps>,
    refusals: [AtomicU64; Limit::ALL.len()],
}

impl Limits {
    /// No limits yet (see [`Limits::reload`]); `device_caps` is the writer's.
    pub fn new(store: Store, first_tenant: Uuid, device_caps: Arc<TenantCaps>) -> Self {
        Self {
            store,
            first_tenant,
            by_tenant: RwLock::default(),
            transport: AtomicBool::new(false),
            owners: Mutex::default(),
            devices: Mutex::default(),
            device_caps,
            refusals: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// Reads every tenant's profile again; the state of a tenant whose limits changed
    /// starts afresh.
    pub fn reload(&self) -> Result<(), StoreError> {
        let docs = self.store.docs(DocKind::TenantProfile)?;
        let default = docs
            .iter()
            .find(|d| d.doc.get("default").and_then(J::as_bool) == Some(true))
            .map_or_else(default_profile_id, |d| d.id);
        let profiles: HashMap<Uuid, Arc<TenantLimits>> = docs
            .into_iter()
            .filter_map(|d| match TenantLimits::from_profile(&d.title, &d.doc) {
                Ok(l) => Some((d.id, Arc::new(l))),
                Err(e) => {
                    tracing::error!(profile = %d.title, error = %e, "tenant profile has an invalid limit; it bounds nothing");
                    None
                }
            })
            .collect();
        let old = self.by_tenant.read().clone();
        let mut by_tenant = HashMap::new();
        let mut caps = HashMap::new();
        for t in self.store.docs(DocKind::Tenant)? {
            let profile = profile_of(&t.doc).unwrap_or(default);
            let Some(l) = profiles.get(&profile).filter(|l| !l.is_empty()) else { continue };
            // Unchanged limits keep their state (a reload is no fresh allowance).
            let l = old.get(&t.id).filter(|o| *o == l).unwrap_or(l);
            let max = l.count(Limit::MaxDevices);
            if max > 0 {
                let stored = (t.id != self.first_tenant).then_some(t.id);
                let why = format!("maxDevices = {max} of tenant profile '{}'", l.profile);
                caps.insert(stored, (usize::try_from(max).unwrap_or(usize::MAX), why));
            }
            by_tenant.insert(t.id, l.clone());
        }
        self.device_caps.set(caps);
        self.transport.store(by_tenant.values().any(|l| l.has_transport_rates()), Ordering::Release);
        *self.by_tenant.write() = by_tenant;
        Ok(())
    }

    /// `tenant`'s limits, if its profile bounds anything.
    pub fn of(&self, tenant: Uuid) -> Option<Arc<TenantLimits>> {
        self.by_tenant.read().get(&tenant).cloned()
    }

    /// Counts a refusal by `l`.
    fn count(&self, l: Limit) {
        if let Some(i) = Limit::ALL.iter().position(|x| *x == l) {
            self.refusals[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The refusal of count limit `l` at `value` (counted).
    fn refuse(&self, l: Limit, limits: &TenantLimits, value: &dyn fmt::Display) -> String {
        self.count(l);
        limits.refusal(l, value)
    }

    /// Counts one message of `device` carrying `points` data points (0: not telemetry)
    /// against its tenant's and its own transport rate limits (a gateway's own: the
    /// gateway-device limits); `RateLimited` naming the spent limit, and nothing counted,
    /// when one is.
    pub fn meter(&self, device: DeviceId, points: usize) -> Result<(), IngestError> {
        self.meter_as(device, points, Sent::Own)
    }

    /// [`Limits::meter`] for a message gateway `gateway` sends for its devices
    /// (`v1/gateway/…`): against its tenant's and the gateway limits, as ThingsBoard counts
    /// it (not against the devices' own).
    pub fn meter_gateway(&self, gateway: DeviceId, points: usize) -> Result<(), IngestError> {
        self.meter_as(gateway, points, Sent::ForDevices)
    }

    fn meter_as(&self, device: DeviceId, points: usize, sent: Sent) -> Result<(), IngestError> {
        if !self.transport.load(Ordering::Acquire) {
            return Ok(());
        }
        let now = Instant::now();
        let (tenant, gateway) = self.device_info(device)?;
        let Some(limits) = self.of(tenant).filter(|l| l.has_transport_rates()) else { return Ok(()) };
        let p = points as f64;
        let [msg, telemetry_msg, data_points] = sent.limits(gateway);
        let telemetry = (
            [(Limit::TenantTelemetryMsg, 1.0), (Limit::TenantDataPoints, p)],
            [(telemetry_msg, 1.0), (data_points, p)],
        );
        type Want<'a> = &'a [(Limit, f64)];
        let (tenant_want, device_want): (Want, Want) =
            if points > 0 { (&telemetry.0, &telemetry.1) } else { (&[(Limit::TenantMsg, 1.0)], &[(msg, 1.0)]) };
        let refused = |l: Limit| IngestError::RateLimited(self.rate_refusal(l, &limits));
        {
            let mut owners = self.owners.lock();
            let m = metered(&mut owners, tenant, &limits);
            m.take(tenant_want, now).map_err(refused)?;
        }
        let mut devices = self.devices.lock();
        if let Err(l) = device_metered(&mut devices, device, (tenant, gateway), &limits).take(device_want, now) {
            drop(devices);
            if let Some(m) = self.owners.lock().get_mut(&tenant) {
                m.give_back(tenant_want);
            }
            return Err(refused(l));
        }
        Ok(())
    }

    /// The refusal of rate limit `l` (counted).
    fn rate_refusal(&self, l: Limit, limits: &TenantLimits) -> String {
        self.count(l);
        limits.refusals.get(l.field()).cloned().unwrap_or_default()
    }

    /// Before a data message of `device` is parsed: its refusal if its tenant's or its
    /// own telemetry-message limit has no token left, so a flood past the limit is refused
    /// without parsing what it carries ([`Limits::meter`] counts what is taken).
    pub fn refuses_data(&self, device: DeviceId) -> Option<IngestError> {
        if !self.transport.load(Ordering::Acquire) {
            return None;
        }
        let now = Instant::now();
        let (tenant, gateway) = self.device_info(device).ok()?;
        let limits = self.of(tenant).filter(|l| l.has_transport_rates())?;
        let (t, d) = (Limit::TenantTelemetryMsg, Sent::Own.limits(gateway)[1]);
        let spent = if !metered(&mut self.owners.lock(), tenant, &limits).has_token(t, now) {
            t
        } else if !device_metered(&mut self.devices.lock(), device, (tenant, gateway), &limits).has_token(d, now) {
            d
        } else {
            return None;
        };
        Some(IngestError::RateLimited(self.rate_refusal(spent, &limits)))
    }

    /// [`Limits::meter`] for an item about to be submitted (its values are its points).
    pub fn meter_item(&self, item: &Item) -> Result<(), IngestError> {
        match item {
            Item::Telemetry { device, records } => self.meter(*device, records.iter().map(|r| r.values.len()).sum()),
            Item::Attributes { device, values, .. } => self.meter(*device, values.len()),
            // Made by the REST API, never sent by a device.
            Item::DeleteAttributes { .. } => Ok(()),
        }
    }

    /// `device`'s own rate limits (messages, telemetry messages, data points) as its
    /// tenant profile writes them (empty: none), and for a gateway also those of what it
    /// sends for its devices: what ThingsBoard's `getSessionLimits` answers.
    pub fn device_rates(&self, device: DeviceId) -> ([String; 3], Option<[String; 3]>) {
        let Some(d) = self.store.device(device).ok().flatten() else { return Default::default() };
        let limits = self.of(d.tenant.unwrap_or(self.first_tenant));
        let rates = |sent: Sent| {
            sent.limits(d.is_gateway())
                .map(|l| limits.as_ref().and_then(|x| x.rate(l)).map(ToString::to_string).unwrap_or_default())
        };
        (rates(Sent::Own), d.is_gateway().then(|| rates(Sent::ForDevices)))
    }

    /// A device was saved: from now on its messages count by its role (gateway or not);
    /// its rate state stays (an edit is no fresh allowance).
    pub fn device_saved(&self, d: &gridlinks_storage::DeviceRecord) {
        if let Some(state) = self.devices.lock().get_mut(&d.id) {
            state.gateway = d.is_gateway();
        }
    }

    /// The tenant of `device` and whether it is a gateway, remembered once read.
    fn device_info(&self, device: DeviceId) -> Result<(Uuid, bool), IngestError> {
        if let Some(d) = self.devices.lock().get(&device) {
            return Ok((d.tenant, d.gateway));
        }
        let record = self.store.device(device)?.ok_or(IngestError::DeviceGone)?;
        let (tenant, gateway) = (record.tenant.unwrap_or(self.first_tenant), record.is_gateway());
        let mut devices = self.devices.lock();
        if devices.len() >= MAX_DEVICES {
            devices.clear();
        }
        devices.entry(device).or_insert(DeviceState { tenant, gateway, metered: None });
        Ok((tenant, gateway))
    }

    /// Counts one REST call of `caller` against its tenant's and customer's limits; the
    /// refusal when one is spent. The system administrator is not bounded.
    pub fn rest(&self, caller: &Caller) -> Result<(), String> {
        if caller.authority == Authority::SysAdmin {
            return Ok(());
        }
        let Some(limits) = self.of(caller.tenant) else { return Ok(()) };
        let now = Instant::now();
        let mut owners = self.owners.lock();
        let mut check = |owner: Uuid, l: Limit| -> Result<(), String> {
            if limits.rate(l).is_none() {
                return Ok(());
            }
            metered(&mut owners, owner, &limits).take(&[(l, 1.0)], now).map_err(|l| self.rate_refusal(l, &limits))
        };
        check(caller.tenant, Limit::TenantRest)?;
        if let Some(customer) = caller.customer {
            check(customer, Limit::CustomerRest)?;
        }
        Ok(())
    }

    /// Whether `tenant` may create one more `kind` (assets, customers, users, dashboards):
    /// the refusal when its profile's count is reached. Devices are bounded by the storage
    /// writer instead.
    pub fn may_create(&self, tenant: Uuid, kind: DocKind) -> Result<(), StoreError> {
        let l = match kind {
            DocKind::Asset => Limit::MaxAssets,
            DocKind::Customer => Limit::MaxCustomers,
            DocKind::User => Limit::MaxUsers,
            DocKind::Dashboard => Limit::MaxDashboards,
            _ => return Ok(()),
        };
        let Some(limits) = self.of(tenant) else { return Ok(()) };
        let max = limits.count(l);
        if max == 0 {
            return Ok(());
        }
        let of = |d: &gridlinks_storage::DocRecord| {
            d.doc.get("tenantId").and_then(J::as_str).and_then(|t| t.parse().ok()).unwrap_or(self.first_tenant)
        };
        let n = self.store.docs(kind)?.iter().filter(|d| of(d) == tenant).count() as u64;
        if n >= max {
            return Err(StoreError::EntitiesLimit(self.refuse(l, &limits, &max)));
        }
        Ok(())
    }

    /// `tenant`'s WebSocket bounds, the limit and its refusal for each: sessions per
    /// tenant and per customer, subscriptions per tenant and per customer (0: none).
    pub fn ws(&self, tenant: Uuid) -> WsLimits {
        let Some(l) = self.of(tenant) else { return WsLimits::default() };
        WsLimits {
            sessions_per_tenant: l.count(Limit::WsSessionsPerTenant),
            sessions_per_customer: l.count(Limit::WsSessionsPerCustomer),
            subscriptions_per_tenant: l.count(Limit::WsSubscriptionsPerTenant),
            subscriptions_per_customer: l.count(Limit::WsSubscriptionsPerCustomer),
            sessions_per_user: l.count(Limit::WsSessionsPerUser),
            subscriptions_per_user: l.count(Limit::WsSubscriptionsPerUser),
            limits: Some(l),
        }
    }

    /// The refusal for WebSocket limit `l` (counted).
    pub fn ws_refusal(&self, w: &WsLimits, l: Limit) -> String {
        match &w.limits {
            Some(limits) => self.refuse(l, limits, &limits.count(l)),
            None => String::new(),
        }
    }
}

/// A tenant's WebSocket bounds (0: none).
#[derive(Default)]
pub struct WsLimits {
    /// `maxWsSessionsPerTenant`.
    pub sessions_per_tenant: u64,
    /// `maxWsSessionsPerCustomer`.
    pub sessions_per_customer: u64,
    /// `maxWsSubscriptionsPerTenant`.
    pub subscriptions_per_tenant: u64,
    /// `maxWsSubscriptionsPerCustomer`.
    pub subscriptions_per_customer: u64,
    /// `maxWsSessionsPerRegularUser`.
    pub sessions_per_user: u64,
    /// `maxWsSubscriptionsPerRegularUser`.
    pub subscriptions_per_user: u64,
    limits: Option<Arc<TenantLimits>>,
}

/// How often a node of a cluster reads the tenant profiles again (another node may have
/// changed them).
const FOLLOW_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// With several nodes: reads the tenant profiles again every [`FOLLOW_EVERY`], so a change
/// made on another node applies here within it (unchanged limits keep their state).
pub async fn follow(limits: Arc<Limits>) {
    let mut tick = tokio::time::interval(FOLLOW_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let l = limits.clone();
        match tokio::task::spawn_blocking(move || l.reload()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "tenant profiles not read again"),
            Err(e) => tracing::warn!(error = %e, "tenant profiles not read again"),
        }
    }
}

/// The rate state of `owner` under `limits` (afresh when its limits changed).
fn metered<'a>(owners: &'a mut HashMap<Uuid, Metered>, owner: Uuid, limits: &Arc<TenantLimits>) -> &'a mut Metered {
    let m = owners.entry(owner).or_insert_with(|| Metered::new(limits.clone()));
    if !Arc::ptr_eq(&m.limits, limits) {
        *m = Metered::new(limits.clone());
    }
    m
}

/// The rate state of `device` of `tenant` under `limits` (afresh when its limits changed).
fn device_metered<'a>(
    devices: &'a mut HashMap<DeviceId, DeviceState>,
    device: DeviceId,
    (tenant, gateway): (Uuid, bool),
    limits: &Arc<TenantLimits>,
) -> &'a mut Metered {
    let entry = devices.entry(device).or_insert(DeviceState { tenant, gateway, metered: None });
    if !entry.metered.as_ref().is_some_and(|m| Arc::ptr_eq(&m.limits, limits)) {
        entry.metered = None;
    }
    entry.metered.get_or_insert_with(|| Metered::new(limits.clone()))
}

/// The tenant profile a tenant document names (`tenantProfileId`).
pub fn profile_of(tenant_doc: &J) -> Option<Uuid> {
    let v = tenant_doc.get("tenantProfileId")?;
    v.get("id").unwrap_or(v).as_str()?.parse().ok()
}

impl metrics::Source for Limits {
    fn encode(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        // The storage writer refuses devices over `maxDevices` (and counts them).
        let values: Vec<(&str, u64)> = Limit::ALL
            .iter()
            .zip(&self.refusals)
            .map(|(l, n)| match l {
                Limit::MaxDevices => (l.field(), self.device_caps.refusals()),
                _ => (l.field(), n.load(Ordering::Relaxed)),
            })
            .collect();
        metrics::labelled_counter(
            e,
            "gridlinks_tenant_limit_refusals_total",
            "Requests, messages, sessions and entities refused by a tenant profile's limit, by its field",
            "limit",
            &values,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_limits_parse_as_thingsboard_writes_them() {
        let r = RateLimit::parse("100:1,2000:60").unwrap().unwrap();
        assert_eq!(r.windows, vec![(100, 1), (2000, 60)]);
        assert_eq!(r.to_string(), "100:1,2000:60");
        assert_eq!(RateLimit::parse(" ").unwrap(), None);
        for bad in ["100", "100:0", "0:1", "a:1", "100:1,", "1:1:1"] {
            assert!(RateLimit::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn every_window_bounds_and_refills_evenly() {
        let r = RateLimit::parse("10:1,15:60").unwrap().unwrap();
        let t0 = Instant::now();
        let mut b = Buckets::full(&r, t0);
        for _ in 0..10 {
            assert!(b.has(1.0));
            b.take(1.0);
        }
        assert!(!b.has(1.0), "the per-second window is spent");
        b.refill(&r, t0 + std::time::Duration::from_secs(1));
        assert!(b.has(5.0) && !b.has(5.5), "the minute window allows 5 more: {:?}", b.tokens);
    }

    #[test]
    fn an_instant_read_before_another_credits_nothing_twice() {
        let r = RateLimit::parse("10:1").unwrap().unwrap();
        let t0 = Instant::now();
        let mut b = Buckets::full(&r, t0);
        b.take(10.0);
        let (early, late) = (t0 + std::time::Duration::from_millis(100), t0 + std::time::Duration::from_millis(200));
        b.refill(&r, late);
        b.refill(&r, early); // a caller that read the clock first, then waited for the lock
        b.refill(&r, late);
        assert!((b.tokens[0] - 2.0).abs() < 1e-9, "200 ms of 10/s: {:?}", b.tokens);
    }

    #[test]
    fn a_refused_message_costs_nothing() {
        let doc = serde_json::json!({"profileData": {"configuration": {
            "transportTenantTelemetryMsgRateLimit": "100:1",
            "transportTenantTelemetryDataPointsRateLimit": "5:1",
        }}});
        let limits = Arc::new(TenantLimits::from_profile("p", &doc).unwrap());
        let mut m = Metered::new(limits);
        let now = Instant::now();
        let want = |p| [(Limit::TenantTelemetryMsg, 1.0), (Limit::TenantDataPoints, p)];
        assert_eq!(m.take(&want(6.0), now), Err(Limit::TenantDataPoints));
        assert!(m.take(&want(5.0), now).is_ok(), "the refused message took no message token");
    }

    #[test]
    fn profiles_name_their_bad_fields() {
        let bad = serde_json::json!({"profileData": {"configuration": {"transportDeviceMsgRateLimit": "fast"}}});
        let e = TenantLimits::from_profile("p", &bad).unwrap_err();
        assert!(e.starts_with("transportDeviceMsgRateLimit:"), "{e}");
        let bad = serde_json::json!({"profileData": {"configuration": {"maxDevices": "ten"}}});
        assert!(TenantLimits::from_profile("p", &bad).unwrap_err().starts_with("maxDevices:"));
        let none =
            serde_json::json!({"profileData": {"configuration": {"maxDevices": 0, "transportDeviceMsgRateLimit": ""}}});
        assert!(TenantLimits::from_profile("p", &none).unwrap().is_empty());
    }
}
