//! File helpers shared by the integration tests that write datasets to disk.
// Each test binary that includes this module uses a part of it.
#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};

/// A fresh temporary directory for one test, named after the test binary and `name`.
pub fn tmp(name: &str) -> PathBuf {
    let binary = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .unwrap_or_default();
    let dir = std::env::temp_dir().join(format!("stoker-{binary}-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes one tar shard of `members` (name, bytes) with the tar crate (GNU headers).
pub fn write_tar(path: &Path, members: &[(String, Vec<u8>)]) {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in members {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, name, &data[..]).unwrap();
    }
    fs::write(path, b.into_inner().unwrap()).unwrap();
}
