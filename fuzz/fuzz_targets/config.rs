//! See `hookgate::fuzzing::config` for the input layout and the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hookgate::fuzzing::config(data));
