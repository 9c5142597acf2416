//! The core's internal handles: places in its tables and counters that name incarnations.
//! Each is its own type, so a client slot can never index the group table, a lease never
//! passes for a delivery sequence number, and so on. None of them leaves the core as such:
//! delivery ids carry a lease as a plain number (`DeliveryId::lease`).

/// A group's place in the mesh's group table. Slots are reused after a group is removed;
/// its `Generation` tells the incarnations apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct GroupSlot(u32);

/// A client's place in its group's client table, reused after the client leaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct ClientSlot(u32);

macro_rules! slot {
    ($t:ident) => {
        impl $t {
            /// The slot at `index` of its table. Tables are bounded by configuration far
            /// below `u32::MAX` entries.
            #[inline]
            pub fn at(index: usize) -> Self {
                debug_assert!(u32::try_from(index).is_ok(), "slot index {index} too large");
                Self(index as u32)
            }

            #[inline]
            pub fn index(self) -> usize {
                self.0 as usize
            }
        }
    };
}
slot!(GroupSlot);
slot!(ClientSlot);

/// Names one incarnation of one group's lane (fresh on every assignment, seek and replay
/// lane); part of every delivery id, so an id of an earlier incarnation is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Lease(u64);

/// Distinguishes a group from an earlier one in the same slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Generation(u64);

/// Names one delivery in its group's ACK-deadline FIFO.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct DeliverySeq(u64);

macro_rules! counter {
    ($t:ident) => {
        impl $t {
            /// The first value a fresh mesh hands out.
            pub const FIRST: Self = Self(1);

            /// Returns the current value and moves the counter on.
            #[inline]
            pub fn take_next(&mut self) -> Self {
                let current = *self;
                self.0 += 1;
                current
            }
        }
    };
}
counter!(Lease);
counter!(Generation);
counter!(DeliverySeq);

impl Lease {
    /// The lease a delivery id names.
    #[inline]
    pub fn new(n: u64) -> Self {
        Self(n)
    }

    /// The number delivery ids carry.
    #[inline]
    pub fn get(self) -> u64 {
        self.0
    }
}
