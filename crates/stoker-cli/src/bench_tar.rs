//! `stoker bench tar`: the same photographs read three ways in one run — a folder of JPEGs
//! (`image_folder:`), WebDataset tar shards in indexed mode (`tar:`, `shuffle_buffer=0`) and in
//! streaming mode (`shuffle_buffer=N`) — through the standard ImageNet pipeline.
//!
//! The shards are written once (beside the folder in the cache) in a shuffled order of the
//! files, as WebDataset shard writers do; each sample is `KEY.jpg` + `KEY.cls`. Every loader gets
//! the same transform, batch size and workers; each runs a warm-up epoch and then `--epochs`
//! measured ones, and the three alternate over `--rounds` rounds, each keeping its best (a shared
//! machine only ever makes a loader slower).

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::time::Instant;

use stoker_core::rng::{Rng, Stream};
use stoker_core::{ImageFolderSource, Loader, LoaderOptions, Source};

use crate::Args;

/// `stoker bench tar [--epochs N] [--batch-size N] [--workers N|auto] [--per-class N]
/// [--shard-size N] [--shuffle-buffer N] [--rounds N]`.
pub(crate) fn tar(args: &Args) -> Result<(), String> {
    args.only(&[
        "epochs",
        "batch-size",
        "workers",
        "per-class",
        "shard-size",
        "shuffle-buffer",
        "rounds",
    ])?;
    let epochs = args.num("epochs", 2)?.max(1);
    let rounds = args.num("rounds", 2)?.max(1);
    let batch_size = args.num("batch-size", 64)?;
    let per_shard = args.num("shard-size", 100)?.max(1);
    let buffer = args.num("shuffle-buffer", 1000)?;
    let workers = args.get("workers").unwrap_or("auto").to_owned();
    let cache = crate::photos::cache_dir();
    let root = crate::photos::imagenet_like(&cache, args.num("per-class", 100)?)?;
    let (pattern, files, shards) = shards_of(&root, per_shard)?;

    let configs: [(&str, Vec<(&str, String)>); 3] = [
        (
            "image_folder",
            vec![
                ("source", format!("image_folder:{}", root.display())),
                ("shuffle", "true".into()),
            ],
        ),
        (
            "tar indexed",
            vec![
                ("source", format!("tar:{pattern}")),
                ("shuffle", "true".into()),
            ],
        ),
        (
            "tar streaming",
            vec![
                ("source", format!("tar:{pattern}")),
                ("shuffle_buffer", buffer.to_string()),
            ],
        ),
    ];
    let mut best: Vec<(f64, f64)> = vec![(0.0, f64::INFINITY); configs.len()];
    let mut threads = 0;
    for round in 1..=rounds {
        for (c, (name, kv)) in configs.iter().enumerate() {
            let mut options = LoaderOptions::default();
            for (k, v) in kv.iter().map(|(k, v)| (*k, v.as_str())).chain([
                ("transform", crate::demo::STANDARD_TRANSFORM),
                ("batch_size", &batch_size.to_string()),
                ("num_workers", &workers),
                ("seed", &round.to_string()),
            ]) {
                options.set(k, v).map_err(|e| e.to_string())?;
            }
            threads = options.resolved_workers().max(1);
            let (rate, first) = measure(&options, epochs)?;
            eprintln!("round {round}/{rounds}: {name:<14} {rate:>8.0} images/s");
            best[c].0 = best[c].0.max(rate);
            best[c].1 = best[c].1.min(first);
        }
    }

    println!();
    println!(
        "{files} JPEGs from {}; {shards} tar shards of {per_shard} ({pattern}); {threads} threads, batch {batch_size}, {}",
        root.display(),
        crate::demo::STANDARD_TRANSFORM
    );
    println!(
        "{:<28} {:>10} {:>12} {:>16}",
        "loader", "images/s", "first batch", "vs image_folder"
    );
    for (c, (name, _)) in configs.iter().enumerate() {
        let label = if c == 2 {
            format!("{name} (buffer {buffer})")
        } else {
            name.to_string()
        };
        println!(
            "{label:<28} {:>10.0} {:>9.1} ms {:>15.2}x",
            best[c].0,
            best[c].1 * 1e3,
            best[c].0 / best[0].0.max(1e-9)
        );
    }
    Ok(())
}

/// Images per second over `epochs` epochs after a warm-up epoch, and seconds to the first batch.
fn measure(options: &LoaderOptions, epochs: usize) -> Result<(f64, f64), String> {
    let created = Instant::now();
    let mut loader = Loader::new(options).map_err(|e| e.to_string())?;
    let mut first = None;
    let mut measured = 0usize;
    let mut start = Instant::now();
    for epoch in 0..=epochs {
        if epoch == 1 {
            start = Instant::now();
        }
        while let Some(batch) = loader.next().map_err(|e| e.to_string())? {
            first.get_or_insert_with(|| created.elapsed().as_secs_f64());
            if epoch >= 1 {
                measured += batch.len();
            }
        }
    }
    Ok((
        measured as f64 / start.elapsed().as_secs_f64(),
        first.unwrap_or(0.0),
    ))
}

/// The folder's files as tar shards of `per_shard` samples, in a shuffled order, written once.
/// Returns the shard pattern, the number of files and of shards.
fn shards_of(root: &Path, per_shard: usize) -> Result<(String, usize, usize), String> {
    let folder = ImageFolderSource::open(root).map_err(|e| e.to_string())?;
    let n = folder.len();
    let shards = n.div_ceil(per_shard).max(1);
    let dir = PathBuf::from(format!("{}-tar-{per_shard}", root.display()));
    let pattern = format!(
        "{}/train-{{{:06}..{:06}}}.tar",
        dir.display(),
        0,
        shards - 1
    );
    let done = dir.join(".complete");
    if done.exists() {
        return Ok((pattern, n, shards));
    }
    eprintln!("writing {shards} tar shards of {n} JPEGs to {} ...", dir.display());
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut order: Vec<usize> = (0..n).collect();
    Rng::for_key(0, Stream::Order, 0, 0).shuffle(&mut order);
    for (s, part) in order.chunks(per_shard).enumerate() {
        let path = dir.join(format!("train-{s:06}.tar"));
        let file = File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut builder = tar::Builder::new(BufWriter::new(file));
        for &i in part {
            let key = format!("{:08}", i);
            let jpg = std::fs::read(folder.path(i))
                .map_err(|e| format!("{}: {e}", folder.path(i).display()))?;
            let cls = folder.label(i).to_string().into_bytes();
            for (ext, data) in [("jpg", &jpg[..]), ("cls", &cls[..])] {
                let mut header = tar::Header::new_gnu();
                header.set_size(data.len() as u64);
                header.set_mode(0o644);
                builder
                    .append_data(&mut header, format!("{key}.{ext}"), data)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
            }
        }
        builder
            .into_inner()
            .and_then(|w| w.into_inner().map_err(|e| e.into_error()))
            .and_then(|f| f.sync_all())
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    std::fs::write(&done, b"").map_err(|e| format!("{}: {e}", done.display()))?;
    Ok((pattern, n, shards))
}
