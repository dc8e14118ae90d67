//! The ThingsBoard-compatible surface served over HTTP: REST paths, parameters and JSON
//! shapes of the admin API ([`api`]), the HTTP device API ([`device_api`], its long polls
//! [`long_poll`]) and the HTTP side of the error body ([`error`]). The contract itself
//! (payload forms, topics, entity JSON, error codes, the bulk import's CSV) is the sans-IO
//! `gridlinks-thingsboard` crate; this module serves it. Behaviour follows ThingsBoard
//! CE's controllers; where GridLinks deliberately differs (clear 400s instead of 500s, for
//! instance) the handler says so.

pub mod alarms;
pub mod api;
pub mod api_keys;
pub mod assets;
pub mod claim;
pub mod customers;
pub mod dashboards;
pub mod device_api;
pub mod entity_query;
pub mod error;
pub mod extract;
pub mod long_poll;
pub mod lookups;
pub mod mqtt_clients;
pub mod notifications;
pub mod ota;
pub mod paging;
pub mod profiles;
pub mod relations;
pub mod rpc;
pub mod sinks;
pub mod tenant_profiles;
pub mod tenants;
pub mod users;
