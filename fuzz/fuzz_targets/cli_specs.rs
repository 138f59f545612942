//! The command line's value parsers: sizes (`--max-memory 64M`), durations (`--timeout
//! 1m30s`), environment assignments (`--env NAME=VALUE`). The first byte picks the parser.
//! Parsing never panics; a value that parses prints back to something that parses to the
//! same value. (The network allow-list spec parser, `--net-allow`, gets a target here when it
//! lands.)
#![no_main]

use libfuzzer_sys::fuzz_target;
use lockbox_policy::{parse_duration, ByteSize, EnvPolicy};

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    match which % 3 {
        0 => {
            if let Ok(size) = text.parse::<ByteSize>() {
                let shown = size.to_string();
                let back: ByteSize = shown.parse().expect("a shown size parses");
                assert_eq!(back, size, "{text:?} -> {shown:?}");
            }
        }
        1 => {
            let _ = parse_duration(text);
        }
        _ => {
            if let Ok((name, value)) = EnvPolicy::parse_assignment(text) {
                assert_eq!(format!("{name}={value}"), text);
            }
        }
    }
});
