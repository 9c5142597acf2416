//! `unimesh-sim --seeds N [--from S] [--jobs J] [--small] [--classic]`: sweep seeds of the
//! Kafka world (of the classic world with `--classic`), print progress, rates and fault
//! counts; on a failure print the seed, the clause and a short trace.
//!
//! `--hashes` prints `seed trace-hash digest` per seed of the classic world instead (the
//! list that `sim/tests/trace_hashes.txt` keeps); `--check-hashes FILE` runs the seeds of
//! such a list in the classic world and fails on the first that differs (a refactor of the
//! core or the harness must keep every one).

use std::process::ExitCode;
use std::time::Instant;

use unimesh_sim::options::{Size, World};
use unimesh_sim::sweep::sweep_world;

struct Args {
    seeds: u64,
    from: u64,
    jobs: usize,
    size: Size,
    world: World,
    hashes: bool,
    check: Option<String>,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        seeds: 1_000,
        from: 0,
        jobs: 1,
        size: Size::Normal,
        world: World::Kafka,
        hashes: false,
        check: None,
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
            "--classic" => args.world = World::Classic,
            "--hashes" => args.hashes = true,
            "--check-hashes" => {
                args.check = Some(it.next().ok_or("--check-hashes needs a file")?);
            }
            "-h" | "--help" => {
                return Err("usage: unimesh-sim [--seeds N] [--from S] [--jobs J] [--small] [--classic] [--hashes | --check-hashes FILE]".into())
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
    if let Some(file) = &args.check {
        return check_hashes(file, args.size, args.jobs);
    }
    if args.hashes {
        return print_hashes(args.from, args.seeds, args.size, args.jobs);
    }
    println!(
        "unimesh-sim: seeds {}..{} world={:?} size={:?} jobs={}",
        args.from,
        args.from.saturating_add(args.seeds),
        args.world,
        args.size,
        args.jobs
    );
    // The options of the first seed, as an example of what a seed decides.
    print!("{}", args.world.options(args.from, args.size));
    let start = Instant::now();
    let (totals, failure) = sweep_world(
        args.from,
        args.seeds,
        args.size,
        args.world,
        args.jobs,
        |t, secs| {
            println!(
                "  {:>8} seeds  {:>8.0} seeds/s  {:>10.0} steps/s",
                t.seeds,
                t.seeds as f64 / secs,
                t.steps as f64 / secs
            );
        },
    );
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
    println!(
        "  zombie deliveries {}, deliveries of records the broker lost {}, lost tails reported {}, offsets done by absence {}",
        totals.zombie_deliveries, totals.lost_deliveries, totals.truncations_reported, totals.done_by_absence
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

/// Prints `seed trace-hash digest` for each seed, in seed order.
fn print_hashes(from: u64, seeds: u64, size: Size, jobs: usize) -> ExitCode {
    let list: Vec<u64> = (from..from.saturating_add(seeds)).collect();
    let mut failed = false;
    for (seed, outcome) in hashes_of(&list, size, jobs) {
        match outcome {
            Ok((trace, digest)) => println!("{seed} {trace:016x} {digest:016x}"),
            Err(f) => {
                eprintln!("{f}");
                failed = true;
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Runs the seeds of a `--hashes` list and compares; prints every difference.
fn check_hashes(file: &str, size: Size, jobs: usize) -> ExitCode {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("cannot read {file}: {e}");
            return ExitCode::from(2);
        }
    };
    let want = match unimesh_sim::sweep::parse_hash_list(&text) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("{file}: {e}");
            return ExitCode::from(2);
        }
    };
    let start = Instant::now();
    let seeds: Vec<u64> = want.iter().map(|w| w.0).collect();
    let mut differ = 0usize;
    for ((seed, outcome), &(_, trace, digest)) in
        hashes_of(&seeds, size, jobs).into_iter().zip(&want)
    {
        match outcome {
            Ok(got) if got == (trace, digest) => {}
            Ok((t, d)) => {
                differ += 1;
                println!("seed {seed}: trace {t:016x} digest {d:016x}, list says {trace:016x} {digest:016x}");
            }
            Err(f) => {
                differ += 1;
                println!("seed {seed} failed: {f}");
            }
        }
    }
    println!(
        "{} seeds checked in {:.1}s, {differ} differ",
        want.len(),
        start.elapsed().as_secs_f64()
    );
    if differ == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

type HashOutcome = Result<(u64, u64), unimesh_sim::Failure>;

/// (seed, (trace hash, digest)) for each seed, in the order given, on `jobs` threads.
fn hashes_of(seeds: &[u64], size: Size, jobs: usize) -> Vec<(u64, HashOutcome)> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let out: std::sync::Mutex<Vec<(usize, u64, HashOutcome)>> = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&seed) = seeds.get(i) else { return };
                let r = unimesh_sim::run_seed_classic(seed, size).map(|r| (r.trace_hash, r.digest));
                out.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((i, seed, r));
            });
        }
    });
    let mut out = out.into_inner().unwrap_or_else(|e| e.into_inner());
    out.sort_by_key(|x| x.0);
    out.into_iter().map(|(_, seed, r)| (seed, r)).collect()
}
