//! See `hookgate::fuzzing::key_extraction` for the input layout and the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hookgate::fuzzing::key_extraction(data));
