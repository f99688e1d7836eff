//! See `hookgate::fuzzing::shopify_signature` for the input layout and the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| hookgate::fuzzing::shopify_signature(data));
