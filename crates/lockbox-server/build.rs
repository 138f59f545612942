//! Embeds the console's static files (`ui/`) in the binary: writes `$OUT_DIR/ui_files.rs`,
//! a table of `(relative path, include_bytes!(absolute path))`, rebuilt when `ui/` changes.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            walk(&path, out)?;
        } else if path.is_file() {
            out.push(path);
        }
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("ui");
    println!("cargo:rerun-if-changed={}", root.display());
    let mut files = Vec::new();
    if root.is_dir() {
        walk(&root, &mut files)?;
    }
    files.sort();
    let mut table = String::from("&[\n");
    for file in &files {
        let rel = file.strip_prefix(&root)?;
        let (Some(rel), Some(abs)) = (rel.to_str(), file.to_str()) else {
            return Err(format!("ui/ file name is not UTF-8: {}", file.display()).into());
        };
        // Dot files (editor swap files, .gitkeep) are not part of the console.
        if rel.split('/').any(|part| part.starts_with('.')) {
            continue;
        }
        writeln!(table, "    ({rel:?}, include_bytes!({abs:?})),")?;
    }
    table.push(']');
    let out = PathBuf::from(std::env::var("OUT_DIR")?).join("ui_files.rs");
    std::fs::write(out, table)?;
    Ok(())
}
