//! JSON strings written as serde_json writes them, with a fast path for
//! the common string that needs no escaping.
//!
//! Written by hand because serde_json checks each byte against its table
//! of escapes, one at a time: callgrind counted 7.5k instructions per
//! duplicate in that check (the canonical fingerprint's keys and strings)
//! and 2.3k per forgery (the log line's). This decides for a whole string
//! at once and leaves every string that does need an escape to serde_json.

/// Appends `text` as a JSON string: copied whole when no byte of it needs
/// escaping, escaped by serde_json otherwise. JSON escapes `"`, `\` and the
/// control characters below 0x20, and serde_json escapes nothing else, so
/// both ways write the same bytes (as a stored fingerprint needs).
pub fn push_str(out: &mut Vec<u8>, text: &str) {
    if needs_escaping(text.as_bytes()) {
        // Serializing a string into a Vec cannot fail.
        let _ = serde_json::to_writer(out, text);
    } else {
        out.reserve(text.len() + 2);
        out.push(b'"');
        out.extend_from_slice(text.as_bytes());
        out.push(b'"');
    }
}

/// Whether JSON must escape a byte of `bytes`. Checked in blocks of 16
/// bytes without a branch, so that the compiler turns each block into a
/// few vector instructions; the last, short block is padded with spaces,
/// which need no escape.
fn needs_escaping(bytes: &[u8]) -> bool {
    fn any_escaped(block: &[u8; 16]) -> bool {
        block.iter().fold(false, |any, &b| {
            any | (b < 0x20) | (b == b'"') | (b == b'\\')
        })
    }
    let (blocks, rest) = bytes.as_chunks::<16>();
    let mut last = [b' '; 16];
    last[..rest.len()].copy_from_slice(rest);
    blocks.iter().any(any_escaped) || any_escaped(&last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_written_byte_for_byte_as_serde_json_writes_them() {
        let mut texts: Vec<String> = Vec::new();
        // Every ASCII character first, in the middle and last, in strings
        // shorter than a block, of one and two blocks, and between.
        for c in (0u32..0x80).filter_map(char::from_u32) {
            for len in 1..=33 {
                for at in [0, len / 2, len - 1] {
                    let mut text = "x".repeat(len);
                    text.replace_range(at..=at, &c.to_string());
                    texts.push(text);
                }
            }
        }
        texts.extend(["", "evt_1", "\u{2028}", "é😀", "\u{7f}", "tab\there"].map(String::from));
        for text in &texts {
            let mut out = b"prefix".to_vec();
            push_str(&mut out, text);
            let mut expected = b"prefix".to_vec();
            serde_json::to_writer(&mut expected, text).unwrap();
            assert_eq!(out, expected, "{text:?}");
            // The fast path is taken exactly when serde_json escapes nothing.
            let escapes = expected.len() != b"prefix".len() + text.len() + 2;
            assert_eq!(needs_escaping(text.as_bytes()), escapes, "{text:?}");
        }
    }
}
