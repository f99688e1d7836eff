//! The fuzz corpus (`fuzz/corpus/<target>/`), replayed on every test run
//! through the same functions the cargo-fuzz targets call: an input that
//! once crashed a target, once checked in, keeps it from coming back.

use std::collections::BTreeSet;
use std::path::Path;

use hookgate::fuzzing::TARGETS;

#[test]
fn every_corpus_input_runs_through_its_target_without_a_panic() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    let mut replayed = 0;
    for (name, target) in TARGETS {
        let dir = root.join(name);
        let entries = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}: every target has a corpus", dir.display()));
        let mut inputs = 0;
        for entry in entries {
            let path = entry.unwrap().path();
            let data = std::fs::read(&path).unwrap();
            let outcome = std::panic::catch_unwind(|| target(&data));
            assert!(outcome.is_ok(), "{name} panicked on {}", path.display());
            inputs += 1;
        }
        assert!(inputs > 0, "{name} has an empty corpus");
        replayed += inputs;
    }
    assert!(replayed >= TARGETS.len());
}

/// A target or corpus without an entry in `TARGETS` would be fuzzed but
/// never replayed here: every file of `fuzz/fuzz_targets/` and every folder
/// of `fuzz/corpus/` must name one.
#[test]
fn every_fuzz_target_and_corpus_is_in_the_replayed_list() {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let names: BTreeSet<&str> = TARGETS.iter().map(|(name, _)| *name).collect();
    for folder in ["fuzz_targets", "corpus"] {
        for entry in std::fs::read_dir(fuzz.join(folder)).unwrap() {
            let path = entry.unwrap().path();
            let stem = path.file_stem().unwrap().to_string_lossy();
            assert!(
                names.contains(&*stem),
                "fuzz/{folder}/{stem}: add it to hookgate::fuzzing::TARGETS"
            );
        }
    }
}
