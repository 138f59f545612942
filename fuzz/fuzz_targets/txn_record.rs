//! Transaction records and commit intents (the WAL) as found on disk: decoding never
//! panics. The first byte picks the record kind.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lockbox_txn::{Intent, TxnRecord};
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    if which % 2 == 0 {
        let _ = TxnRecord::decode(Path::new("txn.json"), rest);
    } else {
        let _ = Intent::decode(Path::new("intent.json"), rest);
    }
});
