pub mod config;
pub mod engine;
pub mod event;
pub mod http;
pub mod json_numbers;
pub mod policy;
pub mod spec_json;
pub mod storage;
pub mod trace;

pub use storage::{kafka, log, state};
