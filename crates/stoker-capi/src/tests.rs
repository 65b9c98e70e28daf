//! Rust-side tests of the boundary and the header; the C suite under `ctests/` tests the ABI as C
//! programs use it.

use std::ffi::{c_char, CStr, CString};
use std::ptr::{null, null_mut};

use crate::batch::*;
use crate::dlpack::DLManagedTensorVersioned;
use crate::error::stoker_last_error;
use crate::ffi::boundary;
use crate::loader::*;
use crate::options::*;
use crate::types::stoker_status::*;
use crate::types::*;
use crate::version::*;

pub(crate) fn last_error() -> String {
    let mut buf = vec![0u8; 1024];
    let n = stoker_last_error(buf.as_mut_ptr().cast(), buf.len());
    buf.truncate(n.min(1023));
    String::from_utf8(buf).unwrap()
}

#[test]
fn header_version_macros_match_cargo_toml() {
    let header = include_str!("../../../include/stoker.h");
    let define = |name: &str| -> String {
        let prefix = format!("#define {name} ");
        header
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("stoker.h lacks {name}"))
            .trim()
            .to_owned()
    };
    assert_eq!(define("STOKER_ABI_VERSION"), ABI_VERSION.to_string());
    assert_eq!(
        define("STOKER_VERSION"),
        format!("\"{}\"", env!("CARGO_PKG_VERSION"))
    );
    assert_eq!(
        define("STOKER_VERSION_MAJOR"),
        env!("CARGO_PKG_VERSION_MAJOR")
    );
    assert_eq!(
        define("STOKER_VERSION_MINOR"),
        env!("CARGO_PKG_VERSION_MINOR")
    );
    assert_eq!(
        define("STOKER_VERSION_PATCH"),
        env!("CARGO_PKG_VERSION_PATCH")
    );
    assert_eq!(define("STOKER_MAX_DIMS"), STOKER_MAX_DIMS.to_string());
}

#[test]
fn abi_and_crate_versions_are_reported() {
    assert_eq!(stoker_abi_version(), 1);
    // SAFETY: stoker_version returns a static NUL-terminated string.
    let v = unsafe { CStr::from_ptr(stoker_version()) };
    assert_eq!(v.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
}

#[test]
fn a_panic_becomes_internal_with_its_message() {
    let status = boundary("stoker_test", || -> stoker_status { panic!("boom {}", 7) });
    assert_eq!(status, STOKER_ERR_INTERNAL);
    let msg = last_error();
    assert!(
        msg.contains("stoker_test") && msg.contains("boom 7"),
        "{msg}"
    );
    let p = boundary("stoker_test", || -> *mut u8 { panic!("again") });
    assert!(p.is_null());
}

#[test]
fn last_error_copies_and_reports_the_full_length() {
    let o = stoker_options_new();
    let key = CString::new("batch_size").unwrap();
    let value = CString::new("0").unwrap();
    assert_eq!(
        stoker_options_set(o, key.as_ptr(), value.as_ptr()),
        STOKER_ERR_INVALID_ARGUMENT
    );
    let full = stoker_last_error(null_mut(), 0);
    assert!(full > 10);
    let mut small = [0x55u8; 5];
    assert_eq!(stoker_last_error(small.as_mut_ptr().cast(), 5), full);
    assert_eq!(small[4], 0);
    assert_eq!(&small[..4], b"opti");
    assert!(last_error().contains("`batch_size`"));
    stoker_options_free(o);
    // Another thread has no error.
    std::thread::spawn(|| assert_eq!(stoker_last_error(null_mut(), 0), 0))
        .join()
        .unwrap();
}

#[test]
fn null_arguments_are_invalid_never_a_crash() {
    let key = CString::new("seed").unwrap();
    assert_eq!(
        stoker_options_set(null_mut(), key.as_ptr(), key.as_ptr()),
        STOKER_ERR_INVALID_ARGUMENT
    );
    assert!(last_error().contains("stoker_options_set: argument `o` is NULL"));
    let mut loader = std::ptr::dangling_mut::<stoker_loader>();
    assert_eq!(
        stoker_loader_new(null(), &mut loader),
        STOKER_ERR_INVALID_ARGUMENT
    );
    assert!(loader.is_null(), "out-pointer cleared on failure");
    assert_eq!(stoker_loader_batches_per_epoch(null()), -1);
    assert_eq!(stoker_loader_epoch(null()), 0);
    assert_eq!(stoker_batch_num_fields(null()), 0);
    stoker_loader_free(null_mut());
    stoker_batch_release(null_mut());
    stoker_options_free(null_mut());
}

/// Writes a uint8 `.npy` of shape (rows, cols) where element (r, c) = r.
fn write_npy(path: &std::path::Path, rows: usize, cols: usize) {
    let data: Vec<u8> = (0..rows)
        .flat_map(|r| std::iter::repeat_n(r as u8, cols))
        .collect();
    stoker_core::source::write_npy(path, stoker_core::DType::U8, &[rows, cols], &data).unwrap();
}

fn set(o: *mut stoker_options, k: &str, v: &str) {
    let (k, v) = (CString::new(k).unwrap(), CString::new(v).unwrap());
    assert_eq!(stoker_options_set(o, k.as_ptr(), v.as_ptr()), STOKER_OK);
}

#[test]
fn batches_dlpack_exports_and_stats() {
    let dir = std::env::temp_dir().join(format!("stoker-capi-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("x.npy");
    write_npy(&path, 10, 3);
    let o = stoker_options_new();
    set(o, "source", &format!("npy:{}", path.display()));
    set(o, "batch_size", "4");
    set(o, "num_workers", "1");
    let mut l = null_mut();
    assert_eq!(stoker_loader_new(o, &mut l), STOKER_OK, "{}", last_error());
    stoker_options_free(o);
    assert_eq!(stoker_loader_batches_per_epoch(l), 3);

    let mut b = null_mut();
    assert_eq!(stoker_loader_next(l, &mut b), STOKER_OK);
    let mut t = stoker_tensor::EMPTY;
    assert_eq!(stoker_batch_field(b, 0, &mut t), STOKER_OK);
    // SAFETY: name is a NUL-terminated string valid while `b` lives.
    assert_eq!(unsafe { CStr::from_ptr(t.name) }.to_str().unwrap(), "data");
    assert_eq!((t.ndim, t.shape[0], t.shape[1]), (2, 4, 3));
    assert_eq!((t.strides[0], t.strides[1]), (3, 1));
    assert_eq!(t.device_type, 1);
    assert_eq!(
        stoker_batch_field(b, 1, &mut t),
        STOKER_ERR_INVALID_ARGUMENT
    );
    assert!(t.data.is_null());

    let mut d: *mut DLManagedTensorVersioned = null_mut();
    assert_eq!(stoker_batch_to_dlpack(b, 0, &mut d), STOKER_OK);
    stoker_batch_release(b);
    // SAFETY: the export is live until its deleter runs; the batch memory stays with it.
    unsafe {
        let dl = &(*d).dl_tensor;
        assert_eq!((*d).version.major, 1);
        assert_eq!(*dl.shape.add(1), 3);
        let data = std::slice::from_raw_parts(dl.data as *const u8, 12);
        assert_eq!(data, &[0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]);
        ((*d).deleter.unwrap())(d);
    }

    let mut stats = stoker_stats {
        size: 16, // an old caller that knows only `batches`
        samples: 99,
        ..Default::default()
    };
    assert_eq!(stoker_loader_stats(l, &mut stats), STOKER_OK);
    assert_eq!((stats.size, stats.batches, stats.samples), (16, 1, 99));

    let mut needed = 0usize;
    assert_eq!(
        stoker_loader_save_state(l, null_mut(), 0, &mut needed),
        STOKER_OK
    );
    let mut buf = vec![b'#' as c_char; needed];
    assert_eq!(
        stoker_loader_save_state(l, buf.as_mut_ptr(), needed - 1, &mut needed),
        STOKER_ERR_INVALID_ARGUMENT
    );
    assert!(buf.iter().all(|&c| c == b'#' as c_char), "nothing written");
    assert_eq!(
        stoker_loader_save_state(l, buf.as_mut_ptr(), needed, &mut needed),
        STOKER_OK
    );
    // SAFETY: NUL-terminated by the call above.
    let state = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap();
    assert!(state.contains("consumed=4;"), "{state}");
    stoker_loader_free(l);
    std::fs::remove_dir_all(dir).unwrap();
}

/// The generated text that is checked in is what its generators make now, in the order they feed
/// each other: the option tables of `docs/options.md` and of `stoker_options_set`'s doc comment
/// are the core's key table, rendered; `include/stoker.h` is what cbindgen generates from this
/// crate (`cbindgen.toml`), that doc comment included. `STOKER_BLESS=1` rewrites all three.
#[test]
fn generated_option_tables_and_header_are_fresh() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let bless = std::env::var_os("STOKER_BLESS").is_some();
    let regenerate =
        "run STOKER_BLESS=1 cargo test -p stoker-capi generated_ and commit the result";

    let table = stoker_core::options::options_markdown();
    // The table lands inside the header's C comment: a `*/` (a glob's `**/`) would end it there.
    if let Some(line) = table.lines().find(|l| l.contains("*/")) {
        panic!("an option's text holds `*/`, which ends the header's C comment: {line}");
    }
    let doc: String = table.lines().map(|l| format!("/// {l}\n")).collect();
    for (file, body) in [
        ("docs/options.md", table.clone()),
        ("crates/stoker-capi/src/options.rs", doc),
    ] {
        let path = root.join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        let prefix = if file.ends_with(".rs") { "/// " } else { "" };
        let begin = format!("{prefix}<!-- options:begin -->\n");
        let end = format!("{prefix}<!-- options:end -->");
        let a = text
            .find(&begin)
            .unwrap_or_else(|| panic!("{file}: no {begin:?}"))
            + begin.len();
        let b = text[a..]
            .find(&end)
            .unwrap_or_else(|| panic!("{file}: no {end:?}"))
            + a;
        if bless {
            std::fs::write(&path, format!("{}{body}{}", &text[..a], &text[b..])).unwrap();
        } else {
            assert_eq!(
                text[a..b],
                body,
                "{file}: the option table differs from stoker_core::options::OPTIONS; {regenerate}"
            );
        }
    }

    // After the tables: the header carries options.rs's doc comment as it is now.
    let crate_dir = env!("CARGO_MANIFEST_DIR");
    let config = cbindgen::Config::from_file(format!("{crate_dir}/cbindgen.toml")).unwrap();
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .unwrap_or_else(|e| panic!("cbindgen could not generate the header: {e}"))
        .write(&mut generated);
    let generated = String::from_utf8(generated).unwrap();
    let header_path = root.join("include/stoker.h");
    if bless {
        std::fs::write(&header_path, &generated).unwrap();
        return;
    }
    let header = std::fs::read_to_string(&header_path).unwrap();
    if header != generated {
        let line = header
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(header.lines().count().min(generated.lines().count()));
        let near = |text: &str| {
            text.lines()
                .skip(line.saturating_sub(2))
                .take(5)
                .collect::<Vec<_>>()
                .join("\n")
        };
        panic!(
            "include/stoker.h is not what cbindgen generates from crates/stoker-capi (first \
             difference at line {}); {regenerate}.\nchecked in:\n{}\ngenerated:\n{}",
            line + 1,
            near(&header),
            near(&generated)
        );
    }
}

/// The C++ face's typed setters (`stoker::Options::KEY(...)`, each calling `set("KEY", ...)`)
/// cover exactly the documented keys: none missing, none the core does not know.
#[test]
fn cpp_typed_setters_cover_every_key() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let hpp = std::fs::read_to_string(root.join("bindings/cpp/include/stoker/stoker.hpp")).unwrap();
    let start = hpp
        .find("class Options {")
        .expect("stoker.hpp: no class Options");
    let body = &hpp[start..];
    let body = &body[..body.find("\n};").expect("class Options does not end")];
    let mut setters = std::collections::BTreeSet::new();
    for line in body.lines() {
        let line = line.trim();
        let Some(rest) = line.strip_prefix("Options& ") else {
            continue;
        };
        let name = &rest[..rest.find('(').unwrap_or(rest.len())];
        if name == "set" || name == "operator=" {
            continue;
        }
        // `source` is set in code through a bridge too; `num_workers_auto` sets `num_workers`.
        let key = name.strip_suffix("_auto").unwrap_or(name);
        setters.insert(key.to_owned());
        if let Some(at) = line.find("set(\"") {
            let called = &line[at + 5..];
            let called = &called[..called.find('"').unwrap()];
            assert_eq!(called, key, "stoker.hpp: setter `{name}` sets `{called}`");
        }
    }
    let keys: std::collections::BTreeSet<String> =
        stoker_core::options::keys().map(str::to_owned).collect();
    let missing: Vec<_> = keys.difference(&setters).collect();
    let unknown: Vec<_> = setters.difference(&keys).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "stoker.hpp's typed setters: missing {missing:?}, not option keys {unknown:?}"
    );
}

/// The C++ face's `stoker::Stats` is the cxx bridge's `StatsInfo` (filled by an exhaustive
/// struct literal from the core's `Stats`): its fields are `stoker_stats`'s, in order, less
/// `size`, plus the per-worker `worker_busy_ns`.
#[test]
fn cpp_stats_fields_are_the_c_structs() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let header = std::fs::read_to_string(root.join("include/stoker.h")).unwrap();
    let bridge = std::fs::read_to_string(root.join("bindings/cpp/src/lib.rs")).unwrap();
    let body = |text: &str, open: &str| -> Vec<String> {
        let start = text.find(open).unwrap_or_else(|| panic!("no `{open}`")) + open.len();
        let end = text[start..].find('}').unwrap() + start;
        text[start..end]
            .lines()
            .map(|l| l.trim())
            .filter(|l| !l.is_empty() && !l.starts_with("//") && !l.starts_with('*'))
            .filter(|l| !l.starts_with("/*"))
            .map(|l| {
                let l = l.trim_end_matches([';', ',']);
                // C: `uint64_t batches`; Rust: `batches: u64`.
                match l.split_once(':') {
                    Some((name, _)) => name.trim().to_owned(),
                    None => l.rsplit(' ').next().unwrap().to_owned(),
                }
            })
            .collect()
    };
    let mut c = body(&header, "typedef struct stoker_stats {");
    assert_eq!(c.remove(0), "size");
    c.push("worker_busy_ns".to_owned());
    let cxx = body(&bridge, "struct StatsInfo {");
    assert_eq!(
        cxx, c,
        "bindings/cpp/src/lib.rs StatsInfo against include/stoker.h stoker_stats"
    );
}

#[test]
fn launcher_codes_are_the_cores() {
    use stoker_core::Launcher;
    for (core, c) in [
        (Launcher::None, stoker_launcher::STOKER_LAUNCHER_NONE),
        (
            Launcher::Explicit,
            stoker_launcher::STOKER_LAUNCHER_EXPLICIT,
        ),
        (
            Launcher::Torchrun,
            stoker_launcher::STOKER_LAUNCHER_TORCHRUN,
        ),
        (Launcher::Slurm, stoker_launcher::STOKER_LAUNCHER_SLURM),
        (Launcher::OpenMpi, stoker_launcher::STOKER_LAUNCHER_OPENMPI),
        (Launcher::Pmi, stoker_launcher::STOKER_LAUNCHER_PMI),
    ] {
        assert_eq!(core.code(), c as u64, "{core}");
    }
}

/// The first column of every row of the next batch (`write_npy` rows hold their index).
fn first_ids(l: *mut stoker_loader) -> Option<Vec<u8>> {
    let mut b = null_mut();
    match stoker_loader_next(l, &mut b) {
        STOKER_OK => {}
        STOKER_END_OF_EPOCH => return None,
        other => panic!("{other:?}: {}", last_error()),
    }
    let mut t = stoker_tensor::EMPTY;
    assert_eq!(stoker_batch_field(b, 0, &mut t), STOKER_OK);
    let rows = t.shape[0] as usize;
    // SAFETY: a uint8 [rows, 3] field, valid while `b` lives.
    let data = unsafe { std::slice::from_raw_parts(t.data as *const u8, rows * 3) };
    let ids = data.chunks(3).map(|r| r[0]).collect();
    stoker_batch_release(b);
    Some(ids)
}

#[test]
fn set_epoch_and_the_resolved_launch_in_stats() {
    let dir = std::env::temp_dir().join(format!("stoker-capi-epoch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("x.npy");
    write_npy(&path, 12, 3);
    let make = || {
        let o = stoker_options_new();
        set(o, "source", &format!("npy:{}", path.display()));
        set(o, "batch_size", "2");
        set(o, "shuffle", "true");
        set(o, "num_workers", "2");
        set(o, "rank", "1");
        set(o, "world_size", "2");
        let mut l = null_mut();
        assert_eq!(stoker_loader_new(o, &mut l), STOKER_OK, "{}", last_error());
        stoker_options_free(o);
        l
    };
    // Epoch 3 as an uninterrupted loader delivers it.
    let reference = make();
    for _ in 0..3 {
        while first_ids(reference).is_some() {}
    }
    let mut epoch3 = Vec::new();
    while let Some(ids) = first_ids(reference) {
        epoch3.push(ids);
    }
    assert_eq!(
        epoch3.len(),
        3,
        "6 of 12 samples on this rank, in batches of 2"
    );
    stoker_loader_free(reference);

    let l = make();
    first_ids(l).unwrap(); // mid-epoch 0, work in flight
    assert_eq!(stoker_loader_set_epoch(l, 3), STOKER_OK);
    assert_eq!(stoker_loader_epoch(l), 3);
    let mut got = Vec::new();
    while let Some(ids) = first_ids(l) {
        got.push(ids);
    }
    assert_eq!(
        got, epoch3,
        "set_epoch(3) starts at the first batch of epoch 3"
    );
    assert_eq!(stoker_loader_epoch(l), 4);

    let mut stats = stoker_stats {
        size: std::mem::size_of::<stoker_stats>() as u64,
        ..Default::default()
    };
    assert_eq!(stoker_loader_stats(l, &mut stats), STOKER_OK);
    assert_eq!((stats.rank, stats.world_size), (1, 2));
    assert_eq!(
        stats.launcher,
        stoker_launcher::STOKER_LAUNCHER_EXPLICIT as u64
    );
    assert_eq!(
        stats.batches, 4,
        "the discarded batches were never delivered"
    );
    assert_eq!(
        stoker_loader_set_epoch(null_mut(), 1),
        STOKER_ERR_INVALID_ARGUMENT
    );
    stoker_loader_free(l);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn options_launch_resolves_without_a_loader() {
    let o = stoker_options_new();
    set(o, "rank", "2");
    set(o, "world_size", "3");
    let mut launch = stoker_launch::default();
    assert_eq!(stoker_options_launch(o, &mut launch), STOKER_OK);
    assert_eq!((launch.rank, launch.world_size), (2, 3));
    assert_eq!(
        launch.launcher,
        stoker_launcher::STOKER_LAUNCHER_EXPLICIT as u64
    );
    set(o, "rank", "3");
    assert_eq!(
        stoker_options_launch(o, &mut launch),
        STOKER_ERR_INVALID_ARGUMENT
    );
    assert!(last_error().contains("rank 3"), "{}", last_error());
    assert_eq!(launch, stoker_launch::default(), "zeroed on failure");
    assert_eq!(
        stoker_options_launch(o, null_mut()),
        STOKER_ERR_INVALID_ARGUMENT
    );
    stoker_options_free(o);
}
