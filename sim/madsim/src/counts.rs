//! How many of each fault a run injected, and what the clients did: reported per run and
//! summed over a sweep, so a sweep shows that every kind of fault actually happened.

use std::fmt;
use std::ops::AddAssign;

macro_rules! counters {
    ($($name:ident),* $(,)?) => {
        /// Counts of every injected fault and client misbehaviour of a run.
        #[derive(Clone, Debug, Default, PartialEq, Eq)]
        pub struct Counts { $(pub $name: u64,)* }

        impl AddAssign<&Counts> for Counts {
            fn add_assign(&mut self, o: &Counts) { $(self.$name += o.$name;)* }
        }

        impl fmt::Display for Counts {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let mut sep = "";
                $(
                    write!(f, "{sep}{}={}", stringify!($name), self.$name)?;
                    sep = " ";
                )*
                let _ = sep;
                Ok(())
            }
        }
    };
}

counters!(
    kills,
    graceful_stops,
    restarts,
    resumed_from_progress,
    clock_jumps,
    append_failures,
    appends_failed_but_written,
    persist_failures,
    persists_failed_but_written,
    fetch_failures,
    fetch_duplicates,
    fetch_rewinds,
    fetch_out_of_range,
    fetch_delays,
    retention_deletions,
    foreign_records,
    seeks,
    replays,
    evictions,
    updates,
    publish_retries,
    polls_vanished,
    polls_handed_back,
    responses_lost,
    acks,
    late_acks,
    double_acks,
    nacks,
    ignored,
    extends,
    stale_acks,
    bogus_acks,
    pauses,
    heartbeat_losses,
    members_expired,
    commits_fenced,
    stale_assignments,
    stream_sessions,
    stream_writes_failed,
    stream_closes,
    stream_overlaps,
    pushes,
    pushes_deferred,
    pushes_failed,
    pushes_hung,
    pushes_refused,
    pushes_not_allowed,
);
