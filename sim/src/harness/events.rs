//! One handler per kind of event. Each lives with its concern: the broker (`broker.rs`),
//! the store (`store.rs`), the clients (`clients.rs`), the mesh's timers (`mesh.rs`),
//! faults of the environment (`faults/`), the end of faults (`liveness.rs`).

use super::queue::Ev;
use super::Sim;
use crate::checker::Violation;

impl Sim {
    pub(super) fn event(&mut self, ev: Ev) -> Result<(), Violation> {
        match ev {
            Ev::ClientSettle { client, id, kind } => self.on_client_settle(client, id, kind),
            Ev::ClientWake { client } => self.on_client_wake(client),
            Ev::ClockJump => self.on_clock_jump(),
            Ev::Crash => self.on_crash(),
            Ev::EndFaults => self.on_end_faults(),
            Ev::FetchAnswer { call, waited } => self.on_fetch_answer(call, waited),
            Ev::FetchRepeat { call, result } => self.on_fetch_repeat(call, result),
            Ev::Publish => self.on_publish(),
            Ev::Reassign {
                inc,
                group,
                partition,
                after_ticket,
            } => self.on_reassign(inc, group, partition, after_ticket),
            Ev::Rebalance => self.on_rebalance(),
            Ev::Replay => self.on_replay(),
            Ev::Restart => self.on_restart(),
            Ev::Retention => self.on_retention(),
            Ev::Seek => self.on_seek(),
            Ev::StoreWork { inc } => self.on_store_work(inc),
            Ev::Tick => self.on_tick(),
        }
    }
}
