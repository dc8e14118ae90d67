//! The ThingsBoard-compatible wire contract, in one place: REST paths, parameters and
//! JSON shapes of the admin API ([`api`]), the HTTP device API ([`device_api`]), the
//! telemetry/attribute payload forms ([`payload`]), entity JSON ([`model`]) and the
//! error body ([`error`]). Behaviour follows ThingsBoard CE's controllers; where
//! GridLinks deliberately differs (clear 400s instead of 500s, for instance) the
//! handler says so.

pub mod api;
pub mod csv;
pub mod device_api;
pub mod device_mqtt;
pub mod error;
pub mod extract;
pub mod model;
pub mod payload;
pub mod relations;
pub mod rpc;
