//! ThingsBoard's wire contract, sans-IO: what devices and REST clients send and receive,
//! with no sockets, no runtime and no storage. The server's transports and handlers
//! decode with it and answer through it; everything here is testable on byte literals.
//!
//! Layout:
//! - [`payload`]: telemetry in every ThingsBoard form, attributes, gateway payloads, typed
//!   as ThingsBoard types values; [`payload::PayloadLimits`], [`payload::PayloadError`].
//! - [`gateway`]: the gateway API's requests and pushes (attribute requests, RPC, claims).
//! - [`topic`]: the MQTT device topics ([`topic::DeviceTopic`]) and the topics answers go to.
//! - [`coap`]: the CoAP device API's resources, from a request's path and query.
//! - [`attributes`]: which attributes a device asks for and the `{"client","shared"}` answer.
//! - [`keys`]: the one parser of comma-separated key lists.
//! - [`model`]: entity references and the REST API's JSON (devices, credentials, pages,
//!   time series, attributes, profiles, relations).
//! - [`multipart`]: the `multipart/form-data` part an OTA upload carries its file in.
//! - [`error`]: ThingsBoard's error body and `errorCode`s.
//! - [`csv`]: the bulk import's CSV lines and cell typing.
//! - [`x509`]: X.509 device credentials and their fingerprint.
//! - [`ws`]: the WebSocket API's telemetry commands and updates.

pub mod attributes;
pub mod coap;
pub mod csv;
pub mod error;
pub mod gateway;
pub mod keyfilter;
pub mod keys;
pub mod model;
pub mod multipart;
pub mod payload;
pub mod topic;
pub mod ws;
pub mod x509;
