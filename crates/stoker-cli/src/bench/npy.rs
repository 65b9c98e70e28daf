//! `stoker bench npy`: shuffled uint8 `[N,3,224,224]` batches from an npy file beside
//! single-thread memcpy bandwidth, measured in the same run; and the npy file the benchmarks
//! generate.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use stoker_core::rng::{Rng, Stream};
use stoker_core::{Loader, LoaderOptions};

use crate::report::{print_stats, Progress};
use crate::workers::Workers;

/// Bytes of one `[3, 224, 224]` uint8 sample.
const SAMPLE_BYTES: usize = 3 * 224 * 224;

/// `stoker bench npy`'s arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct NpyArgs {
    /// Samples in the generated npy file.
    #[arg(long, value_name = "N", default_value_t = 2048)]
    pub(crate) samples: usize,
    /// Samples per batch.
    #[arg(long, value_name = "N", default_value_t = 256)]
    pub(crate) batch_size: usize,
    /// Epochs to run (at least 2: the first one warms up and is not measured).
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub(crate) epochs: usize,
    #[command(flatten)]
    pub(crate) workers: Workers,
    /// An existing npy file to read instead of the generated one.
    #[arg(long, value_name = "FILE")]
    pub(crate) path: Option<PathBuf>,
}

pub(crate) fn run(args: &NpyArgs) -> Result<(), String> {
    let samples = args.samples;
    let batch_size = args.batch_size;
    let epochs = args.epochs.max(2);
    let workers = args.workers.value.as_str();
    let path = match &args.path {
        Some(p) => p.clone(),
        None => generated_npy(samples)?,
    };

    let memcpy_before = memcpy_gbps(batch_size * SAMPLE_BYTES);

    let mut options = LoaderOptions::default();
    for (k, v) in [
        ("source", format!("npy:{}", path.display())),
        ("batch_size", batch_size.to_string()),
        ("shuffle", "true".into()),
        ("drop_last", "true".into()),
        ("num_workers", workers.into()),
    ] {
        options.set(k, &v).map_err(|e| e.to_string())?;
    }
    let created = Instant::now();
    let mut loader = Loader::new(&options).map_err(|e| e.to_string())?;
    let per_epoch = loader.batches_per_epoch();
    if per_epoch == 0 {
        return Err(format!("{samples} samples make no batch of {batch_size}"));
    }
    let mut first_batch = None;
    let mut steady_bytes = 0usize;
    let mut steady_start = None;
    let mut progress = Progress::new("bench npy", per_epoch * epochs);
    // Waits in next() of the measured epochs: each epoch's first batch, and the others.
    // (Workers finish in pairs, so single waits alternate between ~0 and two build times: compare
    // means, not medians.)
    let (mut boundary_waits, mut other_waits) = (Vec::new(), Vec::new());
    for epoch in 0..epochs {
        // The first epoch warms the page cache and the arena; the rest are measured.
        if epoch == 1 {
            steady_start = Some(Instant::now());
        }
        for position in 0.. {
            let asked = Instant::now();
            let Some(batch) = loader.next().map_err(|e| e.to_string())? else {
                break;
            };
            if epoch >= 1 {
                let waits = if position == 0 {
                    &mut boundary_waits
                } else {
                    &mut other_waits
                };
                waits.push(asked.elapsed().as_secs_f64() * 1e3);
            }
            first_batch.get_or_insert_with(|| created.elapsed());
            let bytes = batch.field(0).and_then(|f| f.data).map_or(0, <[u8]>::len);
            if epoch >= 1 {
                steady_bytes += bytes;
            }
            progress.advance(batch.len());
        }
    }
    let steady_secs = steady_start.map_or(0.0, |t| t.elapsed().as_secs_f64());
    let stoker_gbps = steady_bytes as f64 / steady_secs.max(1e-9) / 1e9;
    let memcpy_after = memcpy_gbps(batch_size * SAMPLE_BYTES);
    let memcpy = (memcpy_before + memcpy_after) / 2.0;

    println!();
    println!(
        "npy {} × [3,224,224] uint8, shuffled batches of {batch_size}, num_workers={workers} ({} threads)",
        loader.samples_per_epoch(),
        options.resolved_workers()
    );
    println!(
        "first batch            {:>8.1} ms after construction",
        first_batch.map_or(0.0, |d| d.as_secs_f64() * 1e3)
    );
    println!("stoker                 {stoker_gbps:>8.2} GB/s  (epochs 2..{epochs})");
    println!(
        "memcpy, 1 thread       {memcpy:>8.2} GB/s  (before {memcpy_before:.2}, after {memcpy_after:.2})"
    );
    println!(
        "ratio stoker / memcpy  {:>8.2}",
        stoker_gbps / memcpy.max(1e-9)
    );
    println!(
        "epoch boundary         {:>8.3} ms mean wait for an epoch's first batch, {:.3} ms for the others",
        mean(&boundary_waits),
        mean(&other_waits)
    );
    println!();
    print_stats(&loader.stats());
    Ok(())
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

/// Single-thread `memcpy` bandwidth between two `bytes`-sized buffers: the median of 7 copies.
fn memcpy_gbps(bytes: usize) -> f64 {
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    dst.copy_from_slice(&src); // fault the pages in
    let mut rates: Vec<f64> = (0..7)
        .map(|_| {
            let t = Instant::now();
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut dst);
            bytes as f64 / t.elapsed().as_secs_f64() / 1e9
        })
        .collect();
    rates.sort_by(f64::total_cmp);
    rates[rates.len() / 2]
}

/// A random `[samples, 3, 224, 224]` uint8 npy file in the temp directory, made once.
fn generated_npy(samples: usize) -> Result<PathBuf, String> {
    generated_npy_in(&std::env::temp_dir().join("stoker-bench"), samples)
}

/// A random `[samples, 3, 224, 224]` uint8 npy file in `dir`, made once.
pub(crate) fn generated_npy_in(dir: &Path, samples: usize) -> Result<PathBuf, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(format!("u8-{samples}x3x224x224.npy"));
    let header = npy_header(samples).map_err(|e| format!("{}: {e}", path.display()))?;
    let expected = (header.len() + samples * SAMPLE_BYTES) as u64;
    if std::fs::metadata(&path).is_ok_and(|m| m.len() == expected) {
        return Ok(path);
    }
    eprintln!(
        "writing {} ({:.0} MB) ...",
        path.display(),
        expected as f64 / 1e6
    );
    write_npy(&path, &header, samples).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

fn npy_header(samples: usize) -> std::io::Result<Vec<u8>> {
    stoker_core::source::npy_header(stoker_core::DType::U8, &[samples, 3, 224, 224])
}

fn write_npy(path: &Path, header: &[u8], samples: usize) -> std::io::Result<()> {
    let tmp = path.with_extension("partial");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
    out.write_all(header)?;
    let mut rng = Rng::for_key(0, Stream::Order, 0, 0);
    let mut row = vec![0u8; SAMPLE_BYTES];
    for _ in 0..samples {
        for chunk in row.chunks_exact_mut(8) {
            chunk.copy_from_slice(&rng.next_u64().to_ne_bytes());
        }
        out.write_all(&row)?;
    }
    out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    std::fs::rename(tmp, path)
}
