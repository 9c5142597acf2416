//! Handing ready records to the clients that asked for them.

use super::Group;
use crate::io::Effect;
use crate::mesh::Ctx;

impl Group {
    /// Hands ready records to clients that asked for them: the least loaded client first,
    /// lanes round-robin, lowest offset first within a lane. Nothing goes out before the
    /// epoch is durable.
    pub fn dispatch(&mut self, cx: &mut Ctx) {
        if !cx.dispatch_enabled {
            return;
        }
        let ack_timeout_ms = self.spec.ack_timeout_ms;
        let max_in_flight = self.spec.max_in_flight_per_client;
        while let Some(client) = self.clients.first_ready() {
            let Some(p) = self.lanes.pick() else {
                break;
            };
            let Some((lane, offset)) = self.lanes.pop_ready(p) else {
                continue;
            };
            let deadline = cx.now + ack_timeout_ms;
            // Deadlines only go into the FIFO in order (the ACK timeout may have been
            // lowered).
            let moved = self.acks.out_of_order(deadline);
            let Some((delivery, f)) =
                lane.hand_out(cx, offset, client, deadline, moved, &self.spec.topic)
            else {
                continue;
            };
            self.acks.add(p, offset, f);
            self.acks.compact(&self.lanes);
            self.acks.rearm(&mut cx.timers);
            if delivery.attempt == 1 {
                self.stats.delivered += 1;
            }
            let Some(client) = self.clients.took_delivery(cx, client, max_in_flight) else {
                continue;
            };
            cx.effects.push_back(Effect::Deliver {
                group: self.name.clone(),
                client,
                delivery,
            });
        }
    }
}
