//! Goal: a refactor of the core or of the harness changes no behaviour. Method: the first
//! seeds of `trace_hashes.txt` (recorded before the core was split into its rooms: seed,
//! trace hash, digest of the final stats and views) must give the same hashes again, in
//! the classic world (one mesh over a tidy log: the world the list was recorded in; the
//! Kafka world draws its own options from a separate generator, so a seed's classic run is
//! untouched by it). The whole list (20 000 seeds) is checked in release with
//! `cargo run -p unimesh-sim --release -- --check-hashes sim/tests/trace_hashes.txt --jobs 2`.

use unimesh_sim::options::Size;
use unimesh_sim::run_seed_classic;
use unimesh_sim::sweep::parse_hash_list;

/// Seeds of the list each `cargo test` replays (debug build).
const CHECKED: usize = 300;

#[test]
fn the_recorded_seeds_give_the_recorded_hashes() {
    let list = parse_hash_list(include_str!("trace_hashes.txt")).expect("the list parses");
    assert!(list.len() >= CHECKED, "the list holds {} seeds", list.len());
    let mut differ = Vec::new();
    for &(seed, trace, digest) in list.iter().take(CHECKED) {
        let r = run_seed_classic(seed, Size::Normal).unwrap_or_else(|f| panic!("{f}"));
        if (r.trace_hash, r.digest) != (trace, digest) {
            differ.push(format!(
                "seed {seed}: {:016x} {:016x}, recorded {trace:016x} {digest:016x}",
                r.trace_hash, r.digest
            ));
        }
    }
    assert!(
        differ.is_empty(),
        "behaviour changed:\n{}",
        differ.join("\n")
    );
}
