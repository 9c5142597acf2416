//! A run's trace: a running hash of every step (for the determinism check) and the last
//! steps in a ring buffer (for the failure report). Entries are plain numbers, formatted
//! only when a failure is printed, so tracing costs little per step.

use std::collections::VecDeque;
use std::fmt;

use unimesh_core::Millis;

const RING: usize = 48;

#[derive(Clone, Copy, Debug)]
pub struct Entry {
    pub step: u64,
    pub now: Millis,
    pub what: &'static str,
    pub args: [u64; 4],
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "#{:<7} t={:<7} {:<16} {} {} {} {}",
            self.step, self.now, self.what, self.args[0], self.args[1], self.args[2], self.args[3]
        )
    }
}

#[derive(Clone, Debug)]
pub struct Trace {
    hash: u64,
    /// The last entries, each with the instance it happened at.
    ring: VecDeque<(u32, Entry)>,
    /// Print every entry as it happens (`UNIMESH_TRACE=1`), for debugging one seed.
    pub verbose: bool,
}

impl Default for Trace {
    fn default() -> Self {
        Self {
            hash: 0xcbf2_9ce4_8422_2325,
            ring: VecDeque::with_capacity(RING),
            verbose: false,
        }
    }
}

impl Trace {
    fn mix(&mut self, x: u64) {
        // FNV-1a over the eight bytes: stable across platforms and versions.
        for b in x.to_le_bytes() {
            self.hash ^= u64::from(b);
            self.hash = self.hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    pub fn record(&mut self, e: Entry) {
        self.record_at(0, e);
    }

    /// Records a step that happened at instance `node` of a cluster. The instance is mixed
    /// into the hash only when it is not 0, so a one-mesh trace hashes as it always did.
    pub fn record_at(&mut self, node: u32, e: Entry) {
        self.mix(e.now);
        let mut name = 0u64;
        for b in e.what.bytes() {
            name = name.wrapping_mul(31).wrapping_add(u64::from(b));
        }
        self.mix(name);
        for a in e.args {
            self.mix(a);
        }
        if node != 0 {
            self.mix(u64::from(node));
        }
        if self.verbose {
            eprintln!("{}", show(node, &e));
        }
        if self.ring.len() == RING {
            self.ring.pop_front();
        }
        self.ring.push_back((node, e));
    }

    pub fn hash(&self) -> u64 {
        self.hash
    }

    pub fn last(&self) -> Vec<String> {
        self.ring.iter().map(|(n, e)| show(*n, e)).collect()
    }
}

/// One entry as printed: like its `Display`, with the instance after the time.
fn show(node: u32, e: &Entry) -> String {
    format!(
        "#{:<7} t={:<7} n{node} {:<16} {} {} {} {}",
        e.step, e.now, e.what, e.args[0], e.args[1], e.args[2], e.args[3]
    )
}

/// FNV-1a of some bytes (the trace's own mixing, for digests of text).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}
