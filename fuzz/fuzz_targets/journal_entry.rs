//! One line of a journal run file (JSONL backend) or row (SQLite, PostgreSQL): decoding
//! never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(line) = std::str::from_utf8(data) {
        let _ = lockbox_journal::entry::decode(line);
    }
});
