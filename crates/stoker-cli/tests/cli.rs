//! The `stoker` binary as a user runs it: version, help, usage errors, and plain (non-TTY)
//! output of a real run.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn stoker(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_stoker"))
        .args(args)
        .output()
        .expect("the stoker binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The workspace's version, read from the root Cargo.toml itself: the one place it is defined.
fn workspace_version() -> String {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let in_package = text
        .split("[workspace.package]")
        .nth(1)
        .expect("a [workspace.package] table");
    let line = in_package
        .lines()
        .find(|l| l.trim_start().starts_with("version"))
        .expect("a version key");
    line.split('"').nth(1).unwrap().to_owned()
}

#[test]
fn version_is_the_workspace_version() {
    let out = stoker(&["--version"]);
    assert!(out.status.success());
    assert_eq!(
        text(&out.stdout).trim(),
        format!("stoker {}", workspace_version())
    );
    // Subcommands answer --version too (clap names them `stoker-bench-npy`).
    let out = stoker(&["bench", "npy", "--version"]);
    assert!(out.status.success());
    assert_eq!(
        text(&out.stdout).trim(),
        format!("stoker-bench-npy {}", workspace_version())
    );
}

#[test]
fn help_lists_the_subcommands_and_their_flags() {
    let out = stoker(&["--help"]);
    assert!(out.status.success());
    let help = text(&out.stdout);
    for word in ["demo", "bench", "--version", "--help"] {
        assert!(help.contains(word), "{word} missing from:\n{help}");
    }
    let out = stoker(&["demo", "--help"]);
    assert!(out.status.success());
    let help = text(&out.stdout);
    for flag in [
        "--images",
        "--epochs",
        "--batch-size",
        "--workers",
        "--per-class",
        "--step-ms",
    ] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
    let help = text(&stoker(&["bench", "npy", "--help"]).stdout);
    for flag in [
        "--samples",
        "--batch-size",
        "--epochs",
        "--workers",
        "--path",
    ] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
    let help = text(&stoker(&["bench", "images", "--help"]).stdout);
    assert!(help.contains("[ROOT]"), "{help}");
}

#[test]
fn usage_errors_exit_2_and_name_the_problem() {
    let out = stoker(&["bench", "npy", "--sample", "3"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--sample"),
        "{}",
        text(&out.stderr)
    );
    let out = stoker(&["frobnicate"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("frobnicate"));
}

#[test]
fn a_loader_error_exits_1_with_the_library_message() {
    let missing = Path::new(env!("CARGO_TARGET_TMPDIR")).join("no-such-folder");
    let out = stoker(&[
        "demo",
        "--images",
        missing.to_str().unwrap(),
        "--step-ms",
        "0",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.starts_with("stoker: "), "{err}");
    assert!(err.contains("no-such-folder"), "{err}");
}

/// An image_folder of two classes made of the core crate's real-photo fixtures.
fn image_folder() -> PathBuf {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../stoker-core/tests/data/images");
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-image-folder");
    for (class, files) in [
        ("a", ["photo_baseline.jpg", "photo_444.jpg"]),
        ("b", ["photo_progressive.jpg", "photo_gray.jpg"]),
    ] {
        std::fs::create_dir_all(root.join(class)).unwrap();
        for f in files {
            std::fs::copy(fixtures.join(f), root.join(class).join(f)).unwrap();
        }
    }
    root
}

#[test]
fn demo_output_is_plain_when_not_on_a_terminal() {
    let root = image_folder();
    let out = stoker(&[
        "demo",
        "--images",
        root.to_str().unwrap(),
        "--epochs",
        "2",
        "--batch-size",
        "2",
        "--workers",
        "2",
        "--step-ms",
        "0",
    ]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    // Piped output: no bar redraws, no escape codes; one line per finished epoch.
    for s in [&stdout, &stderr] {
        assert!(!s.contains('\r') && !s.contains('\x1b'), "{s:?}");
    }
    let epoch_lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("epoch ")).collect();
    assert_eq!(epoch_lines.len(), 2, "{stderr}");
    assert!(
        epoch_lines[0].starts_with("epoch 0: 2/2 batches"),
        "{stderr}"
    );
    assert!(
        epoch_lines[1].starts_with("epoch 1: 2/2 batches"),
        "{stderr}"
    );
    assert!(stdout.contains("stoker demo: 4 images from"), "{stdout}");
    assert!(
        stdout.contains("delivered      4 batches, 8 samples\n"),
        "no replacement, none said: {stdout}"
    );
}

#[test]
fn bench_decoders_json_has_a_rate_for_every_decoder_and_thread_count() {
    let root = image_folder();
    // No Python with Pillow here on purpose: its row must say why it has no figures.
    let out = Command::new(env!("CARGO_BIN_EXE_stoker"))
        .args([
            "bench",
            "decoders",
            root.to_str().unwrap(),
            "--rounds",
            "1",
            "--json",
        ])
        .env("PYTHON", "/nonexistent/python")
        .output()
        .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["images"], 4, "{v}");
    let threads = v["threads"].as_array().unwrap().len();
    let rows = v["decoders"].as_array().unwrap();
    let names: Vec<&str> = rows
        .iter()
        .map(|r| r["decoder"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"zune-jpeg, whole image"), "{names:?}");
    for row in rows {
        let rates = row["images_per_s"].as_array().unwrap();
        assert_eq!(rates.len(), threads, "{row}");
        if row["decoder"].as_str().unwrap().starts_with("Pillow") {
            assert!(rates.iter().all(|r| r.is_null()), "{row}");
            assert!(
                row["error"]
                    .as_str()
                    .unwrap()
                    .contains("/nonexistent/python"),
                "{row}"
            );
        } else {
            assert!(rates.iter().all(|r| r.as_f64().unwrap() > 0.0), "{row}");
        }
    }
}

/// An image folder of `n` small JPEGs in two classes.
fn two_class_folder(root: &Path, n: usize) {
    for i in 0..n {
        let class = root.join(if i % 2 == 0 { "cat" } else { "dog" });
        std::fs::create_dir_all(&class).unwrap();
        let (w, h) = (40 + (i % 4) as u16 * 30, 50);
        let px: Vec<u8> = (0..w as usize * h as usize * 3)
            .map(|k| (k * 7 + i * 31) as u8)
            .collect();
        let mut jpg = Vec::new();
        jpeg_encoder::Encoder::new(&mut jpg, 90)
            .encode(&px, w, h, jpeg_encoder::ColorType::Rgb)
            .unwrap();
        std::fs::write(class.join(format!("{i:03}.jpg")), jpg).unwrap();
    }
}

#[test]
fn pack_writes_the_same_bytes_twice_and_slices_merge_into_one_dataset() {
    let dir = std::env::temp_dir().join(format!("stoker-cli-pack-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let root = dir.join("images");
    two_class_folder(&root, 12);
    let src = format!("image_folder:{}", root.display());
    let one = |name: &str, extra: &[&str]| {
        let out = dir.join(name);
        let mut args = vec!["pack", &src, out.to_str().unwrap(), "--max-side", "64"];
        args.extend_from_slice(extra);
        let o = stoker(&args);
        assert!(o.status.success(), "{}", text(&o.stderr));
        assert!(text(&o.stdout).contains("packed"), "{}", text(&o.stdout));
        out
    };
    let a = one("a.stkpack", &[]);
    let b = one("b.stkpack", &[]);
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());

    for i in ["0", "1"] {
        let o = one("sliced", &["--shard-index", i, "--num-shards", "2"]);
        assert!(o.is_dir());
    }
    let merged = stoker(&["pack", "--merge", dir.join("sliced").to_str().unwrap()]);
    assert!(merged.status.success(), "{}", text(&merged.stderr));

    use stoker_core::source::{PackedSource, Source};
    let whole = PackedSource::open(a.to_str().unwrap()).unwrap();
    let sliced = PackedSource::open(dir.join("sliced").to_str().unwrap()).unwrap();
    assert_eq!(whole.len(), 12);
    assert_eq!(sliced.len(), 12);
    let (mut x, mut y) = (Vec::new(), Vec::new());
    for i in 0..12 {
        let (s, t) = (
            whole.read(i, &mut x).unwrap(),
            sliced.read(i, &mut y).unwrap(),
        );
        assert_eq!((s.get(0), s.get(1)), (t.get(0), t.get(1)), "sample {i}");
    }

    let bad = stoker(&[
        "pack",
        &src,
        dir.join("c").to_str().unwrap(),
        "--quality",
        "0",
    ]);
    assert!(!bad.status.success());
    assert!(
        text(&bad.stderr).contains("quality"),
        "{}",
        text(&bad.stderr)
    );
}

/// The JSON a `--json` benchmark printed, after checking it succeeded.
fn json_of(out: &Output) -> serde_json::Value {
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: not JSON:\n{}", text(&out.stdout)))
}

fn positive(v: &serde_json::Value, key: &str) -> f64 {
    let x = v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number in {v}"));
    assert!(x > 0.0, "{key} = {x} in {v}");
    x
}

#[test]
fn bench_doctor_checks_the_prediction_on_each_shape() {
    let data = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench-doctor-data");
    let v = json_of(&stoker(&[
        "bench",
        "doctor",
        "--quick",
        "--synthetic",
        "--data-dir",
        data.to_str().unwrap(),
        "--images",
        "8",
        "--npy-samples",
        "16",
        "--seconds",
        "0.05",
        "--batch-size",
        "4",
        "--rounds",
        "1",
        "--json",
    ]));
    assert_eq!(v["target_error_pct"].as_f64(), Some(15.0));
    assert_eq!(v["rounds"].as_u64(), Some(1));
    let shapes = v["shapes"].as_array().unwrap();
    let keys: Vec<&str> = shapes
        .iter()
        .map(|s| s["shape"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["small", "large", "npy"]);
    for s in shapes {
        let name = s["shape"].as_str().unwrap();
        assert!(
            [
                "io",
                "decode",
                "transform",
                "collate",
                "transfer",
                "workers",
                "consumer"
            ]
            .contains(&s["bottleneck"].as_str().unwrap()),
            "{s}"
        );
        for key in [
            "given_samples_per_s",
            "predicted_samples_per_s",
            "model_samples_per_s",
            "measured_samples_per_s",
        ] {
            positive(s, key);
        }
        let error = s["error_pct"].as_f64().unwrap();
        assert_eq!(s["pass"].as_bool(), Some(error.abs() <= 15.0), "{s}");
        assert!(s["checked"].is_array(), "{s}");
        assert!(s["given"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!("num_workers=1")));
        assert_eq!(s["rounds"].as_array().unwrap().len(), 1);
        // Drawn images were asked for, and said so; the npy file has none.
        assert_eq!(s["data_note"].is_string(), name != "npy", "{s}");
        // Advice to pack was followed: the check read a packed copy.
        if s["checked"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c.as_str().unwrap().starts_with("source=packed"))
        {
            assert!(data.join("packed").is_dir());
        }
    }
}

#[test]
fn bench_autotune_reports_fixed_settings_and_autotune() {
    let data = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench-autotune-data");
    let v = json_of(&stoker(&[
        "bench",
        "autotune",
        "--quick",
        "--synthetic",
        "--data-dir",
        data.to_str().unwrap(),
        "--images",
        "8",
        "--npy",
        "--npy-samples",
        "16",
        "--batch-size",
        "4",
        "--batches",
        "10",
        "--fixed-batches",
        "2",
        "--prefetch",
        "2,4",
        "--rounds",
        "1",
        "--json",
    ]));
    let cores = v["cores"].as_u64().unwrap() as usize;
    assert!(cores >= 1);
    assert_eq!(v["batches"].as_u64(), Some(10));
    let workloads = v["workloads"].as_array().unwrap();
    let keys: Vec<&str> = workloads
        .iter()
        .map(|w| w["workload"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["jpeg", "npy"]);
    // npy batches are built far faster: its runs are four times as long.
    assert_eq!(workloads[0]["batches"].as_u64(), Some(10));
    assert_eq!(workloads[1]["batches"].as_u64(), Some(40));
    for w in workloads {
        let fixed = w["fixed"].as_array().unwrap();
        assert_eq!(
            fixed.len(),
            cores * 2,
            "workers 1..=cores, prefetch 2 and 4"
        );
        for f in fixed {
            positive(f, "samples_per_s");
            let workers = f["num_workers"].as_u64().unwrap() as usize;
            assert!((1..=cores).contains(&workers));
            assert!([2, 4].contains(&f["prefetch_factor"].as_u64().unwrap()));
        }
        let best = positive(&w["best_fixed"], "samples_per_s");
        assert!(fixed
            .iter()
            .all(|f| f["samples_per_s"].as_f64().unwrap() <= best));
        let a = &w["autotune"];
        positive(a, "steady_samples_per_s");
        positive(a, "ratio_to_best_fixed");
        let workers = a["num_workers"].as_u64().unwrap() as usize;
        assert!((1..=cores).contains(&workers), "{a}");
        assert!(a["prefetch_factor"].as_u64().unwrap() >= 1);
        assert!(a["autotune_decisions"].is_u64());
        // The first entry is where autotune started: one worker.
        let changes = a["changes"].as_array().unwrap();
        assert_eq!(changes[0]["batch"].as_u64(), Some(0));
        assert_eq!(changes[0]["num_workers"].as_u64(), Some(1));
        assert!(
            changes.len() as u64 - 1 <= a["autotune_decisions"].as_u64().unwrap(),
            "each change seen is a decision: {a}"
        );
        match a["reached_batch"].as_u64() {
            Some(b) => assert!(b >= 1 && b <= w["batches"].as_u64().unwrap(), "{a}"),
            None => assert!(a["reached_s"].is_null()),
        }
    }
}

#[test]
fn tokens_order_writes_the_global_order_the_loaders_deal() {
    let dir = std::env::temp_dir().join(format!("stoker-cli-tokens-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Token k is k: a sample's first token says where it starts.
    let tokens: Vec<u8> = (0..403u16).flat_map(u16::to_le_bytes).collect();
    std::fs::write(dir.join("t.bin"), tokens).unwrap();
    let source = format!("tokens:{}", dir.join("t.bin").display());
    let out = dir.join("order.npy");
    let sets = [
        "seq_len=4",
        "token_dtype=uint16",
        "shuffle=true",
        "seed=9",
        "global_batch_size=12",
    ];
    let mut args = vec!["tokens", "order", source.as_str(), "--out"];
    let out_s = out.display().to_string();
    args.push(&out_s);
    for s in &sets {
        args.extend(["--set", s]);
    }
    args.extend(["--epoch", "1"]);
    let run = stoker(&args);
    assert!(run.status.success(), "{}", text(&run.stderr));
    let array = stoker_core::source::NpyArray::open(&out).unwrap();
    let order: Vec<i64> = (0..array.rows())
        .map(|i| i64::from_ne_bytes(array.row(i).try_into().unwrap()))
        .collect();
    // 100 samples, global batches of 12: 96 of them, distinct, shuffled.
    assert_eq!(order.len(), 96);
    let mut sorted = order.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), 96);
    assert_ne!(order, (0..96).collect::<Vec<i64>>());
    // Epoch 1 of rank 1 of 3 ranks delivers its slice of every global batch from that order.
    let mut o = stoker_core::LoaderOptions::new();
    for s in &sets {
        let (k, v) = s.split_once('=').unwrap();
        o.set(k, v).unwrap();
    }
    for (k, v) in [
        ("source", source.as_str()),
        ("batch_size", "2"),
        ("rank", "1"),
        ("world_size", "3"),
    ] {
        o.set(k, v).unwrap();
    }
    let mut loader = stoker_core::Loader::new(&o).unwrap();
    loader.set_epoch(1).unwrap();
    let mut firsts = Vec::new();
    while let Some(batch) = loader.next().unwrap() {
        let f = batch.field_by_name("input_ids").unwrap();
        for row in f.data.unwrap().chunks_exact(4 * 8) {
            firsts.push(i64::from_ne_bytes(row[..8].try_into().unwrap()) / 4);
        }
    }
    let want: Vec<i64> = order.chunks(12).flat_map(|g| g[4..8].to_vec()).collect();
    assert_eq!(firsts, want);
    let missing = stoker(&["tokens", "order", source.as_str(), "--out", &out_s]);
    assert!(!missing.status.success());
    assert!(
        text(&missing.stderr).contains("seq_len"),
        "{}",
        text(&missing.stderr)
    );
    // Settings a loader refuses (no sample of seq_len 1000) write no order.
    let none = dir.join("none.npy");
    let none_s = none.display().to_string();
    let refused = stoker(&[
        "tokens",
        "order",
        &source,
        "--out",
        &none_s,
        "--set",
        "seq_len=1000",
        "--set",
        "token_dtype=uint16",
    ]);
    assert!(!refused.status.success() && !none.exists());
    assert!(
        text(&refused.stderr).contains("no sample of seq_len 1000"),
        "{}",
        text(&refused.stderr)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn doctor_diagnoses_a_blend_given_in_place_of_the_source() {
    let dir = std::env::temp_dir().join(format!("stoker-cli-doctor-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tokens: Vec<u8> = (0..4003u16).flat_map(u16::to_le_bytes).collect();
    std::fs::write(dir.join("t.bin"), tokens).unwrap();
    let file = dir.join("t.bin").display().to_string();
    let blend = format!("blend=0.7:tokens:{file},0.3:tokens:{file}");
    let run = stoker(&[
        "doctor",
        "--set",
        &blend,
        "--set",
        "seq_len=4",
        "--set",
        "token_dtype=uint16",
        "--samples",
        "64",
        "--json",
    ]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    let report = json_of(&run);
    assert!(positive(&report, "pipeline_samples_per_s") > 0.0);
    assert!(report["stages"]["io"]["us_per_sample"].as_f64().unwrap() > 0.0);
    // A timeline that cannot be written is said before the measurement, not after it.
    let svg = dir.join("no/such/dir/t.svg").display().to_string();
    let bad = stoker(&["doctor", &format!("tokens:{file}"), "--timeline", &svg]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        text(&bad.stderr).contains(&format!("--timeline {svg}: cannot write it")),
        "{}",
        text(&bad.stderr)
    );
    // Neither a source nor a blend: the loader's own message.
    let none = stoker(&["doctor", "--set", "seq_len=4"]);
    assert_eq!(none.status.code(), Some(1));
    assert!(
        text(&none.stderr).contains("option `source`: required"),
        "{}",
        text(&none.stderr)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
