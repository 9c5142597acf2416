//! What a run reports: figures and a digest when it passes, the violation and the last
//! steps of its trace when it fails.

use unimesh_core::Millis;

use super::Sim;
use crate::checker::{CheckerStats, Violation};
use crate::faults::FaultCounts;

/// What a passing run reports.
#[derive(Clone, Debug)]
pub struct RunReport {
    pub seed: u64,
    pub steps: u64,
    pub virtual_ms: Millis,
    pub trace_hash: u64,
    pub faults: FaultCounts,
    pub stats: CheckerStats,
    pub records: u64,
    pub dead_letters: usize,
    /// A hash of the trace and of what the mesh shows at the end of the run (its stats and
    /// every group's view): equal digests for a seed mean the same inputs gave the same
    /// effects, answers and views. `sim/tests/trace_hashes.rs` holds them to a list.
    pub digest: u64,
}

/// A failing run: what broke, and where.
#[derive(Clone, Debug)]
pub struct Failure {
    pub seed: u64,
    pub violation: Violation,
    pub step: u64,
    pub now: Millis,
    pub options: String,
    pub trace: Vec<String>,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "FAILED seed={} at step {} (t={}ms)",
            self.seed, self.step, self.now
        )?;
        writeln!(f, "violated {}", self.violation)?;
        write!(f, "{}", self.options)?;
        writeln!(f, "last steps:")?;
        for line in &self.trace {
            writeln!(f, "  {line}")?;
        }
        let size = if self.options.contains("size=Small") {
            "UNIMESH_SIZE=small "
        } else {
            ""
        };
        write!(
            f,
            "replay with: UNIMESH_SEED={} {size}cargo test -p unimesh-sim replay_seed -- --nocapture",
            self.seed
        )
    }
}

impl Sim {
    /// The trace hash mixed with the mesh's final stats and views (see `RunReport::digest`).
    pub(super) fn digest(&self) -> u64 {
        let mut text = format!("{:016x}", self.trace.hash());
        if let Some(mesh) = &self.mesh {
            text.push_str(&format!(
                "|{}|{:?}|{}",
                mesh.epoch(),
                mesh.stats(),
                mesh.outstanding_persists()
            ));
            for name in mesh.group_names() {
                text.push_str(&format!("|{:?}", mesh.group_view(name)));
            }
        }
        crate::trace::fnv1a(text.as_bytes())
    }

    /// Where every lane stands, for a report of a run that did not converge.
    pub(super) fn lag_report(&self) -> String {
        let mut out = String::new();
        for g in &self.groups {
            for p in 0..self.opt.partitions {
                let wm = self.checker.durable_watermark(&g.name, p);
                out.push_str(&format!(
                    "{}/{p}: durable {:?} end {}; ",
                    g.name,
                    wm,
                    self.broker.end(p)
                ));
            }
            if let Some(v) = self.mesh.as_ref().and_then(|m| m.group_view(&g.name)) {
                for l in &v.lanes {
                    out.push_str(&format!(
                        "[lane {} cursor {} wm {} ranges {:?} in_flight {} queued {} backoff {} fetch {}] ",
                        l.partition, l.cursor, l.watermark, l.ack_ranges, l.in_flight, l.queued, l.backoff, l.fetch_outstanding
                    ));
                }
                out.push_str(&format!("clients {:?}; ", v.clients));
            }
        }
        out
    }
}
