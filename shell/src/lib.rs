pub mod config;
pub mod engine;
pub mod event;
pub mod http;
pub mod kafka;
pub mod log;
pub mod spec_json;
pub mod state;
