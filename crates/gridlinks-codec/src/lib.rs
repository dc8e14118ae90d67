//! Sans-IO wire codecs shared by the GridLinks server and the load generator.
//!
//! This crate owns the byte-level encoding of the protocols GridLinks speaks and
//! nothing else: it never touches a socket, a clock or a task. Callers keep their
//! own `BytesMut` read buffer, hand it to a decoder, and get back a packet, "need
//! more bytes" (`Ok(None)`, buffer untouched) or a typed error; encoders append to
//! a caller-owned `BytesMut`. Session state (packet-id tracking, topic aliases,
//! keep-alive, which side may send what) belongs to the server, not here.
//!
//! # Layout
//!
//! ```text
//! mqtt/
//!   mod.rs         ProtocolVersion, QoS, public re-exports, decode/encode entry points
//!   packet.rs      the packet structs and the `Packet` enum (Debug redacts payloads and secrets)
//!   properties.rs  MQTT 5 property ids, which packet allows which property, property
//!                  block parsing and writing
//!   reason.rs      named reason / return codes and the per-packet valid sets
//!   topic.rs       topic-name and topic-filter syntax checks
//!   wire.rs        primitives: bounds-checked reader, byte sink/counter, varints, strings
//!   decode.rs      fixed-header framing (size limit checked before the body is awaited)
//!                  and the per-packet body parsers
//!   encode.rs      per-packet writers, run twice: once to count, once to write
//!   error.rs       DecodeError, EncodeError
//!   tests/         unit tests on byte literals, round trips, random-input robustness
//! ```
//!
//! The fuzz target for the decoder lives in `fuzz/` at the repository root
//! (`cargo fuzz run mqtt_decode`).

pub mod mqtt;
