
pub mod log;
pub mod spec_json;
pub mod state;
