//! `stoker demo`: the loader on a generated npy dataset, two epochs with a progress bar, then
//! throughput and wait statistics.

use stoker_core::{Loader, LoaderOptions};

use crate::report::{print_stats, Progress};
use crate::Args;

pub(crate) fn run(args: &Args) -> Result<(), String> {
    args.only(&["epochs", "samples", "workers"])?;
    let epochs = args.num("epochs", 2)?;
    let samples = args.num("samples", 2048)?;
    let workers = args.get("workers").unwrap_or("auto");
    let path = crate::bench::generated_npy(samples)?;
    let mut options = LoaderOptions::default();
    for (k, v) in [
        ("source", format!("npy:{}", path.display())),
        ("batch_size", "256".into()),
        ("shuffle", "true".into()),
        ("num_workers", workers.into()),
    ] {
        options.set(k, &v).map_err(|e| e.to_string())?;
    }
    let mut loader = Loader::new(&options).map_err(|e| e.to_string())?;
    println!(
        "stoker demo: {} samples of uint8 [3,224,224] from {}, batch 256, shuffled, {} worker threads",
        loader.samples_per_epoch(),
        path.display(),
        options.resolved_workers()
    );
    for _ in 0..epochs {
        let epoch = loader.epoch();
        let mut progress = Progress::new(format!("epoch {epoch}"), loader.batches_per_epoch());
        while let Some(batch) = loader.next().map_err(|e| e.to_string())? {
            progress.advance(batch.len());
        }
    }
    print_stats(&loader.stats());
    Ok(())
}
