//! The GridLinks server: configuration, authentication, the ThingsBoard-compatible
//! HTTP surface (admin REST API and HTTP device API) and the running application that
//! ties them to the storage writer. The `gridlinks` binary (`main.rs`) is a thin
//! command-line front end over [`app::serve`] and [`config`].
//!
//! Layout: `config` (typed config tree), `auth/` (admin login, JWTs and their secret,
//! login throttle, the password-hashing pool),
//! `thingsboard/` (serves ThingsBoard's REST, HTTP and MQTT device APIs and RPC; the wire
//! contract itself is the sans-IO `gridlinks-thingsboard` crate), `mqtt` (the
//! MQTT transport), `listener` (accept loops, socket options, connection limits, HTTP
//! timeouts), `logging` (rate-limited log lines), `metrics` (every `/metrics` name and its help text),
//! `app` (start-up, router, shutdown).

pub mod app;
pub mod auth;
pub mod cluster;
pub mod coap;
pub mod config;
pub mod console;
pub mod listener;
pub(crate) mod logging;
pub mod metrics;
pub mod mqtt;
pub mod tcp;
pub mod thingsboard;
pub mod ws;
