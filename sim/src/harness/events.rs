//! One handler per kind of event. Each lives with its concern: the broker (`broker.rs`),
//! the store (`store.rs`), the clients (`clients.rs`), a mesh's timers (`mesh.rs`), the
//! coordinator (`cluster.rs`), faults of the environment (`faults/`), the end of faults
//! (`liveness.rs`).

use super::queue::Ev;
use super::Sim;
use crate::checker::Violation;

impl Sim {
    pub(super) fn event(&mut self, ev: Ev) -> Result<(), Violation> {
        match ev {
            Ev::ClientSettle {
                client,
                node,
                id,
                kind,
            } => self.on_client_settle(client, node, id, kind),
            Ev::ClientWake { client } => self.on_client_wake(client),
            Ev::ClockJump => self.on_clock_jump(),
            Ev::Compaction => self.on_compaction(),
            Ev::Crash => self.on_crash(),
            Ev::EndFaults => self.on_end_faults(),
            Ev::FetchAnswer { call, waited } => self.on_fetch_answer(call, waited),
            Ev::FetchRepeat { call, result } => self.on_fetch_repeat(call, result),
            Ev::Handover { lane, from, to } => self.on_handover(lane, from, to),
            Ev::Leave => self.on_leave(),
            Ev::PersistAnswer {
                node,
                inc,
                ticket,
                ok,
            } => self.on_persist_answer(node, inc, ticket, ok),
            Ev::Publish => self.on_publish(),
            Ev::Reassign {
                inc,
                group,
                partition,
                after_ticket,
            } => self.on_reassign(inc, group, partition, after_ticket),
            Ev::Rebalance => self.on_rebalance(),
            Ev::Rejoin { node, inc } => self.on_rejoin(node, inc),
            Ev::Replay => self.on_replay(),
            Ev::Restart { node } => self.on_restart(node),
            Ev::Retention => self.on_retention(),
            Ev::Seek => self.on_seek(),
            Ev::SessionExpired { node, inc } => self.on_session_expired(node, inc),
            Ev::StoreWork { node, inc } => self.on_store_work(node, inc),
            Ev::Tick { node } => self.on_tick(node),
            Ev::Truncation => self.on_truncation(),
            Ev::Zombie => self.on_zombie(),
            Ev::ZombieWakes { node, inc } => self.on_zombie_wakes(node, inc),
        }
    }
}
