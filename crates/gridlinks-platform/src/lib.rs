//! What every GridLinks transport stands on, and nothing of any transport: no HTTP, MQTT
//! wire or CoAP types. It owns the typed configuration ([`config`]); [`Core`] (storage, the
//! ingest boundary, the tenant, the shared services of a cluster in [`cluster`]); auth
//! (users, passwords, JWTs, API keys, throttles); the device-side services every transport
//! calls (ThingsBoard's device API by topic, attribute reads, claims, provisioning); the
//! device-session registry ([`DeviceSessions`]: RPC, shared-attribute pushes, closing
//! sessions); device activity ([`activity`]); MQTT application credentials; the live fan-out of committed data ([`live`]);
//! the `/metrics` registry; and start-up and shutdown ([`Platform::start`]). Transports
//! (`gridlinks-mqtt`, `-coap`, `-tcp`, `-http`) depend on it; it depends on none of them.

pub mod activity;
pub mod alarms;
pub mod attributes;
pub mod auth;
pub mod broker_clients;
pub mod claims;
pub mod cluster;
pub mod config;
pub mod connect_rate;
mod core;
pub mod device_api;
pub mod entities;
pub mod forward;
pub mod guards;
pub mod limits;
pub mod live;
pub mod logging;
pub mod metrics;
pub mod net;
pub mod notify;
pub mod provision;
pub mod rpc;
pub mod sessions;
mod start;

pub use crate::core::{Core, Platform};
pub use sessions::DeviceSessions;
pub use start::{Context, Running, StartError};
