//! The fuzz corpus (`fuzz/corpus/<target>/`), replayed on every test run
//! through the same functions the cargo-fuzz targets call: an input that
//! once crashed a target, once checked in, keeps it from coming back.

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
