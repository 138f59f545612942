//! A branch's `meta.json` as found on disk (possibly torn, tampered or from another
//! version): decoding never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lockbox_cow::BranchMeta;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let _ = BranchMeta::decode(Path::new("meta.json"), data);
});
