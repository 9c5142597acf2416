//! Where events and state are kept: the embedded log, the state stores and Kafka, each in
//! a folder of its own.

pub mod kafka;
pub mod log;
pub mod ports;
pub mod state;

pub(crate) use crate::engine::spawn_blocking;
