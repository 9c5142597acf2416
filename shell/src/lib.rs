
pub mod log;
