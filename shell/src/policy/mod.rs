//! Who may reach the mesh and whom the mesh may reach, as the configuration lists them
//! (issue 19): the browser origins of `server.cors_allowed_origins` and the webhook targets
//! of `push.allowed_hosts`. `config` checks both lists by parsing them here; `http` enforces
//! them (CORS and a stream's `Origin`; a subscription's URL, and every address a pusher
//! connects to).

mod origins;
mod targets;

pub use origins::Origins;
pub use targets::{Refusal, TargetPolicy};
