//! See `hookgate::fuzzing::fingerprint` for the input layout and the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hookgate::fuzzing::fingerprint(data));
