//! `stoker bench images`: the demo's pipeline measured beside the machine's limit for it,
//! decode-only throughput.

use std::path::PathBuf;
use std::time::Instant;

use stoker_core::decode::{decode_rgb, DecodeBuffers};
use stoker_core::{ImageFolderSource, Loader, LoaderOptions, Source};

use crate::report::{print_stats, Progress};
use crate::workers::Workers;

/// `stoker bench images`'s arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct ImagesArgs {
    /// A folder of class subfolders of JPEGs (default: the demo's ImageNet-like folder).
    #[arg(value_name = "ROOT")]
    pub(crate) root: Option<PathBuf>,
    /// Measured epochs (one more runs first, to warm up).
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub(crate) epochs: usize,
    /// Samples per batch.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub(crate) batch_size: usize,
    #[command(flatten)]
    pub(crate) workers: Workers,
    /// Images per class when building the default folder.
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub(crate) per_class: usize,
}

/// `stoker bench images [ROOT]`: the standard pipeline (random_resized_crop(224) + hflip +
/// normalize → float32 NCHW, batch 64) beside decode-only throughput on the same files and the
/// same number of threads, measured in the same run.
pub(crate) fn run(args: &ImagesArgs) -> Result<(), String> {
    let epochs = args.epochs.max(1);
    let batch_size = args.batch_size;
    let workers = args.workers.value.as_str();
    let root = match &args.root {
        Some(root) => root.clone(),
        None => crate::photos::imagenet_like(&crate::photos::cache_dir(), args.per_class)?,
    };
    let mut options = LoaderOptions::default();
    for (k, v) in [
        ("source", format!("image_folder:{}", root.display())),
        ("transform", crate::demo::STANDARD_TRANSFORM.into()),
        ("batch_size", batch_size.to_string()),
        ("shuffle", "true".into()),
        ("num_workers", workers.into()),
    ] {
        options.set(k, &v).map_err(|e| e.to_string())?;
    }
    let threads = options.resolved_workers().max(1);
    let folder = ImageFolderSource::open(&root).map_err(|e| e.to_string())?;
    let files: Vec<PathBuf> = (0..folder.len()).map(|i| folder.path(i)).collect();

    let decode_before = decode_only(&files, threads)?;
    let created = Instant::now();
    let mut loader = Loader::new(&options).map_err(|e| e.to_string())?;
    let mut first_batch = None;
    let mut progress = Progress::new("bench images", loader.batches_per_epoch() * (epochs + 1));
    let mut measured = 0usize;
    let mut measured_start = Instant::now();
    for epoch in 0..=epochs {
        // Epoch 0 warms the page cache, the arena and the decoders' buffers.
        if epoch == 1 {
            measured_start = Instant::now();
        }
        while let Some(batch) = loader.next().map_err(|e| e.to_string())? {
            first_batch.get_or_insert_with(|| created.elapsed());
            if epoch >= 1 {
                measured += batch.len();
            }
            progress.advance(batch.len());
        }
    }
    let pipeline = measured as f64 / measured_start.elapsed().as_secs_f64();
    let decode_after = decode_only(&files, threads)?;
    let decode = (decode_before + decode_after) / 2.0;

    println!();
    println!(
        "{} JPEGs in {} ({} classes), {threads} threads",
        files.len(),
        root.display(),
        folder.classes().len()
    );
    println!(
        "first batch                 {:>8.1} ms after construction",
        first_batch.map_or(0.0, |d| d.as_secs_f64() * 1e3)
    );
    println!(
        "pipeline                    {pipeline:>8.0} images/s  ({}, float32 NCHW, batch {batch_size})",
        crate::demo::STANDARD_TRANSFORM
    );
    println!(
        "decode only                 {decode:>8.0} images/s  (read + decode to RGB8; before {decode_before:.0}, after {decode_after:.0})"
    );
    println!(
        "ratio pipeline / decode     {:>8.2}",
        pipeline / decode.max(1e-9)
    );
    println!();
    print_stats(&loader.stats());
    Ok(())
}

/// Reads and decodes every file once on `threads` threads; images per second.
fn decode_only(files: &[PathBuf], threads: usize) -> Result<f64, String> {
    let start = Instant::now();
    let chunk = files.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let handles: Vec<_> = files
            .chunks(chunk)
            .map(|part| {
                s.spawn(move || -> Result<(), String> {
                    let mut bytes = Vec::new();
                    let mut bufs = DecodeBuffers::default();
                    for path in part {
                        bytes.clear();
                        std::fs::File::open(path)
                            .and_then(|mut f| std::io::Read::read_to_end(&mut f, &mut bytes))
                            .map_err(|e| format!("{}: {e}", path.display()))?;
                        decode_rgb(&bytes, u64::MAX, &mut bufs)
                            .map_err(|e| format!("{}: {e}", path.display()))?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles.into_iter().try_for_each(|h| {
            h.join()
                .map_err(|_| "a decode thread panicked".to_string())?
        })
    })?;
    Ok(files.len() as f64 / start.elapsed().as_secs_f64())
}
