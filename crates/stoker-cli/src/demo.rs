//! `stoker demo`: the standard ImageNet training pipeline on a folder of real photographs — two
//! epochs with a progress bar, then throughput and wait statistics.

use std::path::PathBuf;

use stoker_core::{Loader, LoaderOptions};

use crate::report::{print_stats, Progress};
use crate::workers::Workers;

/// torchvision's ImageNet training transform, fused.
pub(crate) const STANDARD_TRANSFORM: &str =
    "random_resized_crop(224) | hflip | normalize(imagenet)";

/// `stoker demo`'s arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct DemoArgs {
    /// A folder of class subfolders of JPEGs (default: an ImageNet-like folder built from real
    /// photographs in the cache directory).
    #[arg(long, value_name = "ROOT")]
    pub(crate) images: Option<PathBuf>,
    /// Epochs to run.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub(crate) epochs: usize,
    /// Samples per batch.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub(crate) batch_size: usize,
    #[command(flatten)]
    pub(crate) workers: Workers,
    /// Images per class when building the default folder.
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub(crate) per_class: usize,
    /// The simulated training step: how long each batch is held, in milliseconds.
    #[arg(long, value_name = "N", default_value_t = 30)]
    pub(crate) step_ms: u64,
}

pub(crate) fn run(args: &DemoArgs) -> Result<(), String> {
    let epochs = args.epochs;
    // The consumer stands in for a training step of this long per batch, so that the wait
    // statistics read as a trainer's would: readiness 1 means the GPU never waited for data.
    let step = std::time::Duration::from_millis(args.step_ms);
    let batch_size = args.batch_size;
    let workers = args.workers.value.as_str();
    let root = match &args.images {
        Some(root) => root.clone(),
        None => crate::photos::imagenet_like(&crate::photos::cache_dir(), args.per_class)?,
    };
    let mut options = LoaderOptions::default();
    for (k, v) in [
        ("source", format!("image_folder:{}", root.display())),
        ("transform", STANDARD_TRANSFORM.into()),
        ("batch_size", batch_size.to_string()),
        ("shuffle", "true".into()),
        ("num_workers", workers.into()),
    ] {
        options.set(k, &v).map_err(|e| e.to_string())?;
    }
    let mut loader = Loader::new(&options).map_err(|e| e.to_string())?;
    println!(
        "stoker demo: {} images from {}",
        loader.samples_per_epoch(),
        root.display()
    );
    println!(
        "  transform {STANDARD_TRANSFORM} → float32 [{batch_size}, 3, 224, 224], shuffled, {} worker threads",
        options.resolved_workers()
    );
    println!(
        "  JPEG decoder: {}",
        stoker_core::decode::jpeg_decoder_summary()
    );
    println!(
        "  each batch is held for a simulated {} ms training step (--step-ms)",
        step.as_millis()
    );
    for _ in 0..epochs {
        let epoch = loader.epoch();
        let mut progress = Progress::new(format!("epoch {epoch}"), loader.batches_per_epoch());
        while let Some(batch) = loader.next().map_err(|e| e.to_string())? {
            std::thread::sleep(step);
            progress.advance(batch.len());
        }
    }
    print_stats(&loader.stats());
    Ok(())
}
