//! The event queue: what happens next, in virtual time. Events at the same time run in the
//! order they were scheduled (a sequence number breaks ties), so a run is a pure function
//! of its seed.

use std::cmp::Reverse;

use unimesh_core::{DeliveryId, FetchId, FetchResult, Millis, Partition, Ticket};

use super::Sim;
use crate::checker::SettleKind;

/// One kind of event; each has one handler (dispatched in `events.rs`).
#[derive(Clone, Debug)]
pub(super) enum Ev {
    ClientSettle {
        client: usize,
        id: DeliveryId,
        kind: SettleKind,
    },
    ClientWake {
        client: usize,
    },
    ClockJump,
    Crash,
    EndFaults,
    FetchAnswer {
        call: FetchCall,
        waited: bool,
    },
    FetchRepeat {
        call: FetchCall,
        result: FetchResult,
    },
    Publish,
    Reassign {
        inc: u32,
        group: usize,
        partition: Partition,
        after_ticket: Ticket,
    },
    Rebalance,
    Replay,
    Restart,
    Retention,
    Seek,
    StoreWork {
        inc: u32,
    },
    Tick,
}

/// One `Fetch` the mesh asked for, by the incarnation that asked.
#[derive(Clone, Copy, Debug)]
pub(super) struct FetchCall {
    pub(super) inc: u32,
    pub(super) group: usize,
    pub(super) partition: Partition,
    pub(super) fetch_id: FetchId,
    pub(super) from: u64,
    pub(super) max: usize,
}

pub(super) struct Scheduled {
    pub(super) at: Millis,
    seq: u64,
    pub(super) ev: Ev,
}

impl PartialEq for Scheduled {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

impl Sim {
    /// Schedules `ev` `delay` ms from now.
    pub(super) fn at(&mut self, delay: Millis, ev: Ev) {
        self.seq += 1;
        self.queue.push(Reverse(Scheduled {
            at: self.now + delay,
            seq: self.seq,
            ev,
        }));
    }
}
