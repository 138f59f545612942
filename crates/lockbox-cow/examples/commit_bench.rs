//! Commit of N small new files vs `cp -a` of the same files followed by `sync -f` (both
//! durable). Usage: `cargo run --release --example commit_bench -- [N] [DIR]`; DIR (default: a
//! temp dir under /var/tmp) must be on the disk to measure. Prints wall times; asserts nothing.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use lockbox_cow::{Branch, CommitOptions};

fn fill(dir: &Path, n: usize) -> std::io::Result<()> {
    for i in 0..n {
        let sub = dir.join(format!("d{:03}", i % 100));
        std::fs::create_dir_all(&sub)?;
        std::fs::write(
            sub.join(format!("f{i:05}.txt")),
            format!("file {i}\n").repeat(20),
        )?;
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(5000);
    let base = args.next().unwrap_or_else(|| "/var/tmp".into());
    let tmp = tempfile::tempdir_in(base)?;
    let (state, wd, src, dst) = (
        tmp.path().join("state"),
        tmp.path().join("wd"),
        tmp.path().join("src"),
        tmp.path().join("dst"),
    );
    for d in [&state, &wd, &src, &dst] {
        std::fs::create_dir(d)?;
    }
    // An upper layer of N added files is just N new files: write them directly.
    let branch = Branch::create(&state, &wd, serde_json::Value::Null)?;
    fill(&branch.upper_dir(), n)?;
    fill(&src, n)?;
    Command::new("sync").status()?;

    let mut branch = branch;
    let t = Instant::now();
    let report = lockbox_cow::commit(&mut branch, &wd, &CommitOptions::default())?;
    let commit = t.elapsed();
    let t = Instant::now();
    branch.abort()?;
    let remove = t.elapsed();

    let t = Instant::now();
    let ok = Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", src.display()))
        .arg(&dst)
        .status()?
        .success()
        && Command::new("sync").arg("-f").arg(&dst).status()?.success();
    let cp = t.elapsed();
    if !ok {
        return Err("cp -a / sync -f failed".into());
    }
    println!(
        "files={} commit={:.3}s (then branch removal {:.3}s) cp_a_sync_f={:.3}s ratio={:.2}",
        report.added,
        commit.as_secs_f64(),
        remove.as_secs_f64(),
        cp.as_secs_f64(),
        commit.as_secs_f64() / cp.as_secs_f64()
    );
    Ok(())
}
