//! Updates of an existing group's settings (a `Subscribe` for a group that exists). The
//! core applies new settings to new deliveries and keeps in-flight deliveries' deadlines,
//! so the checker follows the ACK timeout and the in-flight bound from the update on.
//! Nothing else is followed: a harness must not change a group's filter (the core applies
//! a new filter only to records not yet fetched, which the checker does not model), its
//! attempt limit or its start position, and must tell the checker again (with the spec
//! the store holds) when a crash undid an update that was not durable yet.

use unimesh_core::SubscriptionSpec;

use super::Checker;

impl Checker {
    /// The group took `spec` as its new settings (after the mesh accepted the update).
    pub fn update_group(&mut self, spec: &SubscriptionSpec) {
        if let Some(g) = self.groups.get_mut(&spec.group) {
            g.ack_timeout_ms = spec.ack_timeout_ms;
            g.max_in_flight = spec.max_in_flight_per_client;
        }
    }
}
