//! Time from loader construction to the first batch (and to the next few), median of several
//! runs, on a folder of class subfolders of JPEGs with the standard ImageNet training pipeline.
//!
//! `cargo run --release -p stoker-core --example first_batch ROOT [RUNS] [NUM_WORKERS]`
//!
//! Each run builds a fresh loader (the page cache is warm after the first run: this measures
//! the loader, not the disk).

use std::time::{Duration, Instant};

use stoker_core::{Loader, LoaderOptions};

const TRANSFORM: &str = "random_resized_crop(224) | hflip | normalize(imagenet)";

/// How many batches after construction each run times.
const BATCHES: usize = 4;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let root = args
        .next()
        .ok_or("usage: first_batch ROOT [RUNS] [NUM_WORKERS]")?;
    let runs: usize = args.next().map_or(Ok(9), |s| s.parse())?;
    let workers = args.next().unwrap_or_else(|| "2".into());

    let mut options = LoaderOptions::new();
    for (k, v) in [
        ("source", format!("image_folder:{root}")),
        ("transform", TRANSFORM.into()),
        ("batch_size", "64".into()),
        ("shuffle", "true".into()),
        ("num_workers", workers.clone()),
    ] {
        options.set(k, &v)?;
    }

    // One untimed run warms the page cache and the folder scan.
    Loader::new(&options)?.next()?;

    let mut built = Vec::with_capacity(runs);
    let mut batches: Vec<Vec<Duration>> = vec![Vec::new(); BATCHES];
    for _ in 0..runs {
        let start = Instant::now();
        let mut loader = Loader::new(&options)?;
        built.push(start.elapsed());
        for at in batches.iter_mut() {
            loader
                .next()?
                .ok_or("the epoch has fewer batches than timed")?;
            at.push(start.elapsed());
        }
    }
    println!("{root}: batch 64, num_workers={workers}, {TRANSFORM}, float32 NCHW");
    println!(
        "construction            {:>8.1} ms (median of {runs})",
        ms(median(built))
    );
    for (i, at) in batches.into_iter().enumerate() {
        let (lo, hi) = (
            at.iter().min().copied().unwrap_or_default(),
            at.iter().max().copied().unwrap_or_default(),
        );
        println!(
            "batch {i} after construction {:>8.1} ms (median of {runs}; min {:.1}, max {:.1})",
            ms(median(at)),
            ms(lo),
            ms(hi)
        );
    }
    Ok(())
}
