//! Where a request came in, as the middleware and the handlers of both listeners see it:
//! the listener, the route label of a request that matched no route, and the connection's
//! slot among `server.max_connections` (put in each request's extensions by `server`,
//! given back by a delivery stream).

use tokio::sync::OwnedSemaphorePermit;

/// Which listener a request came in on. Admin routes are not served on the traffic listener
/// (and the reverse), so the admin port can stay private.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Listener {
    Admin,
    Traffic,
}

/// Label of requests that matched no route.
pub const UNMATCHED_LABEL: &str = "unmatched";

/// A connection's slot among `server.max_connections`. An HTTP/1.1 connection that becomes
/// a delivery stream gives it back ([`ConnSlot::release`]): from then on it counts among
/// the streams (`server.max_streams`), so idle streams cannot starve request connections.
pub struct ConnSlot {
    permit: std::sync::Mutex<Option<OwnedSemaphorePermit>>,
}

impl ConnSlot {
    /// The slot a connection holds while `permit` is held.
    pub fn new(permit: OwnedSemaphorePermit) -> Self {
        Self {
            permit: std::sync::Mutex::new(Some(permit)),
        }
    }

    pub fn release(&self) {
        // A plain `Option`: a panic while it was held cannot leave it broken.
        let mut p = self.permit.lock().unwrap_or_else(|p| p.into_inner());
        p.take();
    }
}
