
pub mod log;
pub mod event;
