//! `stoker bench packed`: the same photographs read four ways in one run — the folder of JPEGs
//! (`image_folder:`), packed with the original JPEGs, packed shrunk to `--max-side` (JPEG), and
//! packed shrunk to `--max-side` as raw pixels — through the standard ImageNet pipeline, with the
//! time `stoker pack` took to write each.
//!
//! Every loader gets the same transform, batch size and workers; each runs a warm-up epoch and
//! then `--epochs` measured ones, and the four alternate over `--rounds` rounds, each keeping
//! its best (a shared machine only ever makes a loader slower).

use std::path::{Path, PathBuf};
use std::time::Instant;

use stoker_core::pack::{open_source, pack, PackMode, PackOptions};
use stoker_core::{Loader, LoaderOptions};

use crate::workers::Workers;

/// One way of reading the photographs.
struct Variant {
    name: String,
    source: String,
    /// Seconds `stoker pack` took, and the bytes it wrote (none for the folder).
    packed: Option<(f64, u64)>,
    best: f64,
}

/// `stoker bench packed`'s arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct PackedBenchArgs {
    /// A folder of class subfolders of JPEGs (default: an ImageNet-like folder of real
    /// photographs in the cache directory).
    #[arg(value_name = "ROOT")]
    pub(crate) root: Option<PathBuf>,
    /// Measured epochs per round (one more runs first, to warm up).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub(crate) epochs: usize,
    /// Rounds over the four sources; each keeps its best.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub(crate) rounds: usize,
    /// Samples per batch.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub(crate) batch_size: usize,
    /// The longer side of the shrunk packs.
    #[arg(long, value_name = "N", default_value_t = 256)]
    pub(crate) max_side: u32,
    #[command(flatten)]
    pub(crate) workers: Workers,
    /// Images per class when building the default folder (250: 3,000 images).
    #[arg(long, value_name = "N", default_value_t = 250)]
    pub(crate) per_class: usize,
}

pub(crate) fn run(args: &PackedBenchArgs) -> Result<(), String> {
    let root = match &args.root {
        Some(root) => root.clone(),
        None => crate::photos::imagenet_like(&crate::photos::cache_dir(), args.per_class)?,
    };
    let out = root.with_file_name(format!(
        "{}-packed",
        root.file_name().unwrap_or_default().to_string_lossy()
    ));
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let folder = format!("image_folder:{}", root.display());
    let source = open_source(&folder).map_err(|e| e.to_string())?;
    let samples = source.len();
    let side = args.max_side;
    let plans = [
        (
            "packed, original JPEGs".to_owned(),
            "original.stkpack",
            None,
            PackMode::Jpeg,
        ),
        (
            format!("packed --max-side {side}"),
            "small.stkpack",
            Some(side),
            PackMode::Jpeg,
        ),
        (
            format!("packed --max-side {side} --mode raw"),
            "raw.stkpack",
            Some(side),
            PackMode::Raw,
        ),
    ];
    let mut variants = vec![Variant {
        name: "image_folder".into(),
        source: folder.clone(),
        packed: None,
        best: 0.0,
    }];
    for (name, file, max_side, mode) in plans {
        let path = out.join(file);
        let options = PackOptions {
            max_side,
            mode,
            ..PackOptions::default()
        };
        eprintln!("stoker bench packed: packing {samples} images ({name})");
        let start = Instant::now();
        let report = pack(&*source, &path, &options, &|_, _| {}).map_err(|e| e.to_string())?;
        variants.push(Variant {
            name,
            source: format!("packed:{}", path.display()),
            packed: Some((start.elapsed().as_secs_f64(), report.bytes)),
            best: 0.0,
        });
    }
    drop(source);

    for round in 0..args.rounds.max(1) {
        for v in &mut variants {
            eprintln!(
                "stoker bench packed: round {} of {}: {}",
                round + 1,
                args.rounds.max(1),
                v.name
            );
            let rate = measure(&v.source, args)?;
            v.best = v.best.max(rate);
        }
    }

    let base = variants[0].best.max(1e-9);
    println!();
    println!(
        "{samples} photographs of {}, {} | batch {} | workers {} | best of {} round(s) of {} epoch(s) after a warm-up",
        root.display(),
        crate::demo::STANDARD_TRANSFORM,
        args.batch_size,
        args.workers.value,
        args.rounds.max(1),
        args.epochs.max(1),
    );
    println!(
        "{:<36} {:>10} {:>8} {:>12} {:>14}",
        "source", "images/s", "ratio", "size MiB", "pack images/s"
    );
    for v in &variants {
        let (size, pack_rate) = match v.packed {
            Some((secs, bytes)) => (
                format!("{:.1}", bytes as f64 / (1 << 20) as f64),
                format!("{:.0}", samples as f64 / secs.max(1e-9)),
            ),
            None => (
                format!("{:.1}", dir_bytes(&root) as f64 / (1 << 20) as f64),
                "-".into(),
            ),
        };
        println!(
            "{:<36} {:>10.0} {:>7.2}x {:>12} {:>14}",
            v.name,
            v.best,
            v.best / base,
            size,
            pack_rate
        );
    }
    Ok(())
}

/// Images per second of the measured epochs of one loader over `source`.
fn measure(source: &str, args: &PackedBenchArgs) -> Result<f64, String> {
    let mut options = LoaderOptions::default();
    for (k, v) in [
        ("source", source.to_owned()),
        ("transform", crate::demo::STANDARD_TRANSFORM.into()),
        ("batch_size", args.batch_size.to_string()),
        ("shuffle", "true".into()),
        ("num_workers", args.workers.value.clone()),
    ] {
        options.set(k, &v).map_err(|e| e.to_string())?;
    }
    let mut loader = Loader::new(&options).map_err(|e| e.to_string())?;
    let mut measured = 0usize;
    let mut start = Instant::now();
    for epoch in 0..=args.epochs.max(1) {
        // Epoch 0 warms the page cache, the arena and the decoders' buffers.
        if epoch == 1 {
            start = Instant::now();
        }
        while let Some(batch) = loader.next().map_err(|e| e.to_string())? {
            if epoch >= 1 {
                measured += batch.len();
            }
        }
    }
    Ok(measured as f64 / start.elapsed().as_secs_f64())
}

/// Bytes of the files under `dir` (one level of class folders).
fn dir_bytes(dir: &Path) -> u64 {
    let Ok(classes) = std::fs::read_dir(dir) else {
        return 0;
    };
    classes
        .flatten()
        .filter_map(|c| std::fs::read_dir(c.path()).ok())
        .flat_map(|files| files.flatten())
        .filter_map(|f| f.metadata().ok())
        .map(|m| m.len())
        .sum()
}
