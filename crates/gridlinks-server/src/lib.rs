//! The GridLinks server: configuration, authentication, the ThingsBoard-compatible
//! HTTP surface (admin REST API and HTTP device API) and the running application that
//! ties them to the storage writer. The `gridlinks` binary (`main.rs`) is a thin
//! command-line front end over [`app::serve`] and [`config`].
//!
//! Layout: `config` (typed config tree), `auth` (admin password, JWT),
//! `thingsboard/` (the wire contract: REST, HTTP and MQTT device APIs, RPC), `mqtt` (the
//! MQTT transport), `app` (start-up, router, shutdown).

pub mod app;
pub mod auth;
pub mod config;
pub mod mqtt;
pub mod thingsboard;
