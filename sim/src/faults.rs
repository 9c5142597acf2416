//! Fault models shared by harnesses: how a broker's fetch answer is distorted, and the
//! counters of every fault injected (reported per run and summed over a sweep).

use std::fmt;
use std::ops::AddAssign;

use unimesh_core::{FetchResult, Offset, Record};

use crate::options::FaultRates;
use crate::rng::Rng;

macro_rules! counters {
    ($($name:ident),* $(,)?) => {
        /// How many of each fault a run injected.
        #[derive(Clone, Debug, Default, PartialEq, Eq)]
        pub struct FaultCounts { $(pub $name: u64,)* }

        impl AddAssign<&FaultCounts> for FaultCounts {
            fn add_assign(&mut self, o: &FaultCounts) { $(self.$name += o.$name;)* }
        }

        impl fmt::Display for FaultCounts {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let mut first = true;
                $(
                    if !first { f.write_str(" ")?; }
                    first = false;
                    write!(f, "{}={}", stringify!($name), self.$name)?;
                )*
                let _ = first;
                Ok(())
            }
        }
    };
}

counters!(
    crashes,
    crashes_mid_persist,
    persist_failures,
    fetch_failures,
    fetch_duplicates,
    fetch_rewinds,
    spurious_out_of_range,
    answers_twice,
    deliveries_lost,
    retention_runs,
    rebalances,
    seeks,
    replays,
    clock_jumps,
    clock_glitches,
    flush_nows,
    disconnects,
    stale_acks,
    bogus_acks,
    late_acks,
    double_acks,
    nacks,
    ignored,
    extends,
    poison_records,
    undecodable_records,
    // The Kafka world.
    transaction_markers,
    aborted_transactions,
    answers_gap_start,
    answers_gap_middle,
    answers_gap_end,
    compactions,
    compacted_records,
    retention_over_ranges,
    truncations,
    truncated_records,
    truncations_detected,
    persist_answers_reordered,
    persist_answers_twice,
    fenced_persists,
    fenced_commits,
    lane_moves,
    assigned_fresher_than_recovered,
    assigned_as_recovered,
    leaves,
    zombies,
    session_expiries,
    client_switches,
);

/// What happened to one fetch answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FetchDistortion {
    None,
    Failed,
    SpuriousOutOfRange,
    Rewound,
    Duplicated,
}

/// Distorts an honest broker answer. `rewind_from` gives the records a rewound answer
/// starts with (the broker's records from an earlier offset).
pub fn distort_fetch(
    rng: &mut Rng,
    rates: &FaultRates,
    honest: FetchResult,
    earliest: Offset,
    end: Offset,
    from: Offset,
    rewind_from: impl FnOnce(Offset) -> Vec<Record>,
) -> (FetchResult, FetchDistortion) {
    if rng.chance(rates.fetch_fail) {
        return (
            FetchResult::Failed {
                reason: "injected broker failure".into(),
            },
            FetchDistortion::Failed,
        );
    }
    let FetchResult::Records(mut records) = honest else {
        return (honest, FetchDistortion::None);
    };
    if rng.chance(rates.fetch_spurious_out_of_range) {
        return (
            FetchResult::OutOfRange { earliest, end },
            FetchDistortion::SpuriousOutOfRange,
        );
    }
    if from > earliest && rng.chance(rates.fetch_rewind) {
        let back = rng.range(1, (from - earliest).min(8));
        let mut earlier = rewind_from(from - back);
        earlier.extend(records);
        return (FetchResult::Records(earlier), FetchDistortion::Rewound);
    }
    if !records.is_empty() && rng.chance(rates.fetch_duplicates) {
        let mut out = Vec::with_capacity(records.len() * 2);
        for r in records.drain(..) {
            if rng.chance(0.5) {
                out.push(r.clone());
            }
            out.push(r);
        }
        return (FetchResult::Records(out), FetchDistortion::Duplicated);
    }
    (FetchResult::Records(records), FetchDistortion::None)
}
