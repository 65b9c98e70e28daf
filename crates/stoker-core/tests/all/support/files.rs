//! File helpers shared by the integration tests that write datasets to disk.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A fresh temporary directory for one test, named after `name`, the process and a count:
/// every test of the binary runs in this process, and two may pass the same name.
pub fn tmp(name: &str) -> PathBuf {
    static COUNT: AtomicUsize = AtomicUsize::new(0);
    let n = COUNT.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("stoker-test-{}-{n}-{name}", std::process::id()));
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

/// Writes `dir/photos.tar`: `n` samples `{i:04}.jpg` (the test photos in turn) with a label
/// `{i:04}.cls` = `i % 3`, and returns its `tar:` source string. Every sample is decoded and
/// transformed when built: streaming tests use it to give the workers real work.
pub fn photo_shard(dir: &Path, n: usize) -> String {
    let photos: Vec<Vec<u8>> = [
        "photo_444.jpg",
        "photo_baseline.jpg",
        "photo_progressive.jpg",
    ]
    .map(test_image)
    .into();
    let members: Vec<(String, Vec<u8>)> = (0..n)
        .flat_map(|i| {
            [
                (format!("{i:04}.jpg"), photos[i % photos.len()].clone()),
                (format!("{i:04}.cls"), (i % 3).to_string().into_bytes()),
            ]
        })
        .collect();
    let path = dir.join("photos.tar");
    write_tar(&path, &members);
    format!("tar:{}", path.display())
}

/// The bytes of `tests/data/images/NAME`, one of the test images.
///
/// The crate's directory is taken from `CARGO_MANIFEST_DIR` at run time when it is set (cargo
/// sets it for the tests it runs; `.ci/gpu.sh` sets it for a test binary built on another
/// machine, whose build-time path does not exist where it runs), else from the build.
pub fn test_image(name: &str) -> Vec<u8> {
    let crate_dir = std::env::var_os("CARGO_MANIFEST_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf(),
        Into::into,
    );
    let path = crate_dir.join("tests/data/images").join(name);
    fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}
