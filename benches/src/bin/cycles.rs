//! Runs a fixed number of deliver+ACK cycles of one bench scenario, for instruction counts
//! that repeat exactly from run to run (criterion's iteration counts vary, so its rig ends
//! in a different state each time). Only `Rig::measured_rounds` is meant to be counted:
//!
//! ```text
//! valgrind --tool=callgrind --collect-atstart=no \
//!     --toggle-collect='*Rig*measured_rounds*' target/release/cycles 100000 1 50000
//! ```
//!
//! `benches/callgrind.sh` runs every scenario that way and prints instructions per delivery.
//!
//! Usage: `cycles IN_FLIGHT ACK_BATCH DELIVERIES` (DELIVERIES rounded down to whole batches).

use std::process::ExitCode;

use unimesh_benches::Rig;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let numbers: Result<Vec<u64>, _> = args.iter().map(|a| a.parse::<u64>()).collect();
    let (in_flight, batch, deliveries) = match numbers.as_deref() {
        Ok(&[f, b, d]) if f >= 1 && b >= 1 && b <= f && f <= u64::from(u32::MAX) => (f, b, d),
        _ => {
            eprintln!("usage: cycles IN_FLIGHT ACK_BATCH DELIVERIES (1 <= ACK_BATCH <= IN_FLIGHT)");
            return ExitCode::from(2);
        }
    };
    let mut rig = Rig::new(in_flight as u32);
    let rounds = deliveries / batch;
    rig.measured_rounds(rounds, batch as usize);
    if let Err(violation) = rig.mesh.check_invariants() {
        eprintln!("invariant violated after the run: {violation}");
        return ExitCode::FAILURE;
    }
    println!(
        "in_flight={in_flight} ack_batch={batch}: {} deliveries",
        rounds * batch
    );
    ExitCode::SUCCESS
}
