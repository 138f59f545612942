//! A whole journal run file of the JSONL backend, as found on disk after a crash or a
//! tamper (torn last line, bad checksum, offsets out of order, another run's entries):
//! reading it through `FileStorage` never panics, and whatever it returns is in offset order
//! from 0.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lockbox_journal::{FileStorage, RunId, Storage};
use std::sync::OnceLock;

struct Setup {
    dir: std::path::PathBuf,
    storage: FileStorage,
    runtime: tokio::runtime::Runtime,
    run: RunId,
}

fn setup() -> &'static Setup {
    static SETUP: OnceLock<Setup> = OnceLock::new();
    SETUP.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("lockbox-fuzz-journal-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        Setup {
            storage: FileStorage::open(&dir).expect("storage"),
            runtime: tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("runtime"),
            run: RunId::parse("r1").expect("run id"),
            dir,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let s = setup();
    std::fs::write(s.dir.join("r1.jsonl"), data).expect("write run file");
    if let Ok(entries) = s.runtime.block_on(s.storage.read(&s.run, 0)) {
        for (i, e) in entries.iter().enumerate() {
            assert_eq!(e.offset, i as u64);
        }
    }
});
