//! `stoker demo`: the standard ImageNet training pipeline on a folder of real photographs — two
//! epochs with a progress bar, then throughput and wait statistics.

use stoker_core::{Loader, LoaderOptions};

use crate::args::DemoArgs;
use crate::report::{print_stats, Progress};

/// torchvision's ImageNet training transform, fused.
pub(crate) const STANDARD_TRANSFORM: &str =
    "random_resized_crop(224) | hflip | normalize(imagenet)";

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
