//! See `hookgate::fuzzing::path_normalization` for the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hookgate::fuzzing::path_normalization(data));
