//! A long sweep of the shell under madsim: `--seeds N [--from S]`; prints each failure with
//! its seed and last steps, and at the end the seeds run, seeds/s and the faults injected.

#[cfg(not(madsim))]
fn main() {
    eprintln!(
        "unimesh-sim-shell runs under the madsim simulator only: build it with \
         RUSTFLAGS=\"--cfg madsim\" (and a target directory of its own)"
    );
    std::process::exit(2);
}

#[cfg(madsim)]
fn main() {
    let mut seeds: u64 = 100;
    let mut from: u64 = 0;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let value = args.next().and_then(|v| v.parse().ok());
        match (a.as_str(), value) {
            ("--seeds", Some(v)) => seeds = v,
            ("--from", Some(v)) => from = v,
            _ => {
                eprintln!("usage: unimesh-sim-shell [--seeds N] [--from S]");
                std::process::exit(2);
            }
        }
    }
    let started = std::time::Instant::now();
    let mut failed = Vec::new();
    let mut counts = unimesh_sim_shell::Counts::default();
    let mut steps = 0;
    for seed in from..from + seeds {
        match unimesh_sim_shell::run_seed(seed) {
            Ok(r) => {
                counts += &r.counts;
                steps += r.steps;
            }
            Err(f) => {
                eprintln!("{f}");
                counts += &f.counts;
                failed.push(seed);
            }
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{seeds} seeds from {from} in {secs:.1} s: {:.2} seeds/s, {steps} engine steps, {} failed {failed:?}",
        seeds as f64 / secs.max(1e-9),
        failed.len()
    );
    println!("injected: {counts}");
    if !failed.is_empty() {
        std::process::exit(1);
    }
}
