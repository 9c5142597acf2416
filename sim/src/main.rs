//! `unimesh-sim --seeds N [--from S] [--jobs J] [--small]`: sweep seeds, print progress,
//! rates and fault counts; on a failure print the seed, the clause and a short trace.

use std::process::ExitCode;
use std::time::Instant;

use unimesh_sim::options::{Options, Size};
use unimesh_sim::sweep::sweep;

struct Args {
    seeds: u64,
    from: u64,
    jobs: usize,
    size: Size,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        seeds: 1_000,
        from: 0,
        jobs: 1,
        size: Size::Normal,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut number = |name: &str| -> Result<u64, String> {
            let v = it.next().ok_or_else(|| format!("{name} needs a number"))?;
            v.parse()
                .map_err(|_| format!("{name}: {v:?} is not a number"))
        };
        match a.as_str() {
            "--seeds" => args.seeds = number("--seeds")?,
            "--from" => args.from = number("--from")?,
            "--jobs" => args.jobs = number("--jobs")?.clamp(1, 64) as usize,
            "--small" => args.size = Size::Small,
            "-h" | "--help" => {
                return Err("usage: unimesh-sim [--seeds N] [--from S] [--jobs J] [--small]".into())
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    // `UNIMESH_SEED=<seed>` replays exactly that seed.
    if let Ok(s) = std::env::var("UNIMESH_SEED") {
        args.from = s
            .parse()
            .map_err(|_| format!("UNIMESH_SEED={s:?} is not a number"))?;
        args.seeds = 1;
    }
    Ok(args)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    println!(
        "unimesh-sim: seeds {}..{} size={:?} jobs={}",
        args.from,
        args.from.saturating_add(args.seeds),
        args.size,
        args.jobs
    );
    // The options of the first seed, as an example of what a seed decides.
    print!("{}", Options::swarm(args.from, args.size));
    let start = Instant::now();
    let (totals, failure) = sweep(args.from, args.seeds, args.size, args.jobs, |t, secs| {
        println!(
            "  {:>8} seeds  {:>8.0} seeds/s  {:>10.0} steps/s",
            t.seeds,
            t.seeds as f64 / secs,
            t.steps as f64 / secs
        );
    });
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{} seeds passed in {:.1}s: {:.0} seeds/s, {} steps ({:.0} steps/s), {} records, {} deliveries",
        totals.seeds,
        secs,
        totals.seeds as f64 / secs,
        totals.steps,
        totals.steps as f64 / secs,
        totals.records,
        totals.deliveries
    );
    println!(
        "  repeated first attempts (crash/rebalance duplicates) {}, late ACKs accepted {}, stale ids refused {}, dead letters {}",
        totals.repeated_first_attempts, totals.late_acks, totals.stale_rejected, totals.dead_letters
    );
    println!("faults injected: {}", totals.faults);
    match failure {
        None => ExitCode::SUCCESS,
        Some(f) => {
            println!("{f}");
            ExitCode::FAILURE
        }
    }
}
