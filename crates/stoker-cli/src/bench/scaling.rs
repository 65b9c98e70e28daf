//! `stoker bench scaling`: how throughput grows with worker threads, on three kinds of work —
//! copying (an npy file of float32 `[3, 112, 112]` samples, 150 KB each), reading pixels that
//! need no decoding (the photographs packed `--max-side 256 --mode raw`) and decoding JPEGs (the
//! folder of photographs) — each through the loader with `num_workers` 1, 2, 4, … up to every
//! usable core, in one run. Per row: samples/s, GB/s delivered, the scaling efficiency
//! (samples/s ÷ (workers × the one-worker samples/s)), minor page faults per batch in the
//! measured epochs (batch memory should be recycled, never faulted again) and the workers' busy
//! share. With a CUDA driver and device, two more figures of the same machine: `device=cuda` on
//! the npy file, and a plain copy from pinned memory to the device, the link's bandwidth.

use std::path::PathBuf;
use std::time::Instant;

use stoker_core::pack::{open_source, pack, PackMode, PackOptions};
use stoker_core::{DType, Loader, LoaderOptions};

/// One sample of the npy workload: float32 `[3, 112, 112]`, 150,528 bytes.
const NPY_SHAPE: [usize; 3] = [3, 112, 112];

/// What one loader run measured.
struct Run {
    samples_per_s: f64,
    bytes_per_s: f64,
    faults_per_batch: f64,
    busy: f64,
}

/// `stoker bench scaling`'s arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct ScalingBenchArgs {
    /// A folder of class subfolders of JPEGs (default: an ImageNet-like folder of real
    /// photographs in the cache directory).
    #[arg(value_name = "ROOT")]
    pub(crate) root: Option<PathBuf>,
    /// Samples in the generated npy file (150 KB each).
    #[arg(long, value_name = "N", default_value_t = 1024)]
    pub(crate) samples: usize,
    /// Samples per batch.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub(crate) batch_size: usize,
    /// Measured epochs per row (one more runs first, to warm up).
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub(crate) epochs: usize,
    /// The most workers measured (default: every usable core).
    #[arg(long, value_name = "N")]
    pub(crate) max_workers: Option<usize>,
    /// Images per class when building the default folder.
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub(crate) per_class: usize,
}

pub(crate) fn run(args: &ScalingBenchArgs) -> Result<(), String> {
    let cores = stoker_core::launch::usable_cores();
    let max = args.max_workers.unwrap_or(cores).max(1);
    let mut counts: Vec<usize> = std::iter::successors(Some(1), |&n| Some(n * 2))
        .take_while(|&n| n < max)
        .collect();
    counts.push(max);

    let dir = crate::photos::cache_dir().join("bench-scaling");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let npy = float32_npy(&dir, args.samples)?;
    let root = match &args.root {
        Some(root) => root.clone(),
        None => crate::photos::imagenet_like(&crate::photos::cache_dir(), args.per_class)?,
    };
    let raw = dir.join("raw256.stkpack");
    if !raw.exists() {
        eprintln!(
            "stoker bench scaling: packing {} --max-side 256 --mode raw",
            root.display()
        );
        let source =
            open_source(&format!("image_folder:{}", root.display())).map_err(|e| e.to_string())?;
        let options = PackOptions {
            max_side: Some(256),
            mode: PackMode::Raw,
            ..PackOptions::default()
        };
        pack(&*source, &raw, &options, &|_, _| {}).map_err(|e| e.to_string())?;
    }
    let transform = crate::demo::STANDARD_TRANSFORM;
    let workloads = [
        ("npy float32 150 KB", format!("npy:{}", npy.display()), None),
        (
            "packed raw 256",
            format!("packed:{}", raw.display()),
            Some(transform),
        ),
        (
            "JPEG image_folder",
            format!("image_folder:{}", root.display()),
            Some(transform),
        ),
    ];

    println!(
        "{cores} usable cores | batch {} | {} measured epoch(s) after a warm-up | transform for images: {transform}",
        args.batch_size,
        args.epochs.max(1)
    );
    println!(
        "{:<20} {:>7} {:>11} {:>8} {:>11} {:>13} {:>6}",
        "workload", "workers", "samples/s", "GB/s", "efficiency", "faults/batch", "busy"
    );
    for (name, source, transform) in &workloads {
        let mut one = None;
        for &workers in &counts {
            let r = measure(source, *transform, workers, None, args)?;
            let base = *one.get_or_insert(r.samples_per_s);
            println!(
                "{name:<20} {workers:>7} {:>11.0} {:>8.2} {:>10.0}% {:>13.1} {:>5.0}%",
                r.samples_per_s,
                r.bytes_per_s / 1e9,
                100.0 * r.samples_per_s / (workers as f64 * base).max(1e-9),
                r.faults_per_batch,
                100.0 * r.busy
            );
        }
    }
    cuda_rows(&workloads[0].1, max, args)
}

/// Runs one loader over `source` for a warm-up epoch and the measured ones.
fn measure(
    source: &str,
    transform: Option<&str>,
    workers: usize,
    device: Option<&str>,
    args: &ScalingBenchArgs,
) -> Result<Run, String> {
    let mut options = LoaderOptions::default();
    let mut set = |k: &str, v: &str| options.set(k, v).map_err(|e| e.to_string());
    set("source", source)?;
    set("batch_size", &args.batch_size.to_string())?;
    set("shuffle", "true")?;
    set("drop_last", "true")?;
    set("num_workers", &workers.to_string())?;
    if let Some(spec) = transform {
        set("transform", spec)?;
    }
    if let Some(device) = device {
        set("device", device)?;
    }
    let mut loader = Loader::new(&options).map_err(|e| e.to_string())?;
    // Epoch 0 warms the page cache, the arena and the decoders' buffers.
    while loader.next().map_err(|e| e.to_string())?.is_some() {}
    let before = loader.stats();
    let start = Instant::now();
    let (mut samples, mut bytes, mut batches) = (0usize, 0usize, 0usize);
    for _ in 0..args.epochs.max(1) {
        while let Some(batch) = loader.next().map_err(|e| e.to_string())? {
            samples += batch.len();
            // Shape and type give the size on the host and on a device alike.
            bytes += batch
                .fields()
                .map(|f| f.shape.iter().product::<usize>() * f.dtype.size())
                .sum::<usize>();
            batches += 1;
        }
    }
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    let after = loader.stats();
    Ok(Run {
        samples_per_s: samples as f64 / secs,
        bytes_per_s: bytes as f64 / secs,
        faults_per_batch: after.page_faults.saturating_sub(before.page_faults) as f64
            / batches.max(1) as f64,
        busy: after.worker_busy,
    })
}

/// A random float32 `[samples, 3, 112, 112]` npy file in `dir`, made once.
fn float32_npy(dir: &std::path::Path, samples: usize) -> Result<std::path::PathBuf, String> {
    let path = dir.join(format!("f32-{samples}x3x112x112.npy"));
    let values = samples * NPY_SHAPE.iter().product::<usize>();
    let header = stoker_core::source::npy_header(DType::F32, &[samples, 3, 112, 112])
        .map_err(|e| e.to_string())?;
    if std::fs::metadata(&path).is_ok_and(|m| m.len() == (header.len() + values * 4) as u64) {
        return Ok(path);
    }
    eprintln!(
        "stoker bench scaling: writing {} ({:.0} MB)",
        path.display(),
        values as f64 * 4e-6
    );
    let data: Vec<u8> = (0..values)
        .flat_map(|i| ((i % 255) as f32 / 255.0).to_ne_bytes())
        .collect();
    stoker_core::source::write_npy(&path, DType::F32, &[samples, 3, 112, 112], &data)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

/// With a CUDA device: the npy workload delivered to it, beside a plain pinned copy of one
/// batch's bytes, in GB/s.
fn cuda_rows(npy: &str, workers: usize, args: &ScalingBenchArgs) -> Result<(), String> {
    if let Ok(devices) = stoker_core::cuda::probe() {
        if devices > 0 {
            let loader = measure(npy, None, workers, Some("cuda"), args)?;
            let bytes = args.batch_size * NPY_SHAPE.iter().product::<usize>() * 4;
            let copy = pinned_copy_bytes_per_s(bytes)?;
            println!(
                "\ncuda:0, {workers} workers: npy to the device {:.2} GB/s; a plain pinned copy of {:.0} MB {:.2} GB/s ({:.0}%)",
                loader.bytes_per_s / 1e9,
                bytes as f64 / 1e6,
                copy / 1e9,
                100.0 * loader.bytes_per_s / copy
            );
            return Ok(());
        }
    }
    println!("\nno CUDA device: the device rows (device=cuda, pinned copy bandwidth) need one");
    Ok(())
}

/// Bytes per second of copies of `bytes` from registered (pinned) host memory to the first
/// CUDA device, one after the other on one stream.
fn pinned_copy_bytes_per_s(bytes: usize) -> Result<f64, String> {
    use std::sync::Arc;
    use stoker_core::cuda::{CudaDevice, DeviceBackend};
    use stoker_core::Arena;

    let device: Arc<CudaDevice> = CudaDevice::open(0).map_err(|e| e.to_string())?;
    let arena = Arena::new(false, Some(device.clone()));
    let host = arena.acquire(bytes).map_err(|e| e.to_string())?;
    let dst = device.alloc(bytes).map_err(|e| e.to_string())?;
    let stream = device.create_stream().map_err(|e| e.to_string())?;
    let done = device.create_event().map_err(|e| e.to_string())?;
    let copies = 20;
    let run = |n: usize| -> Result<f64, String> {
        let start = Instant::now();
        for _ in 0..n {
            // SAFETY: `host` (registered) and `dst` (`bytes` each) stay alive until the event
            // recorded after the copies has completed, which is waited for below.
            unsafe { device.copy_to_device_async(dst, host.as_ptr(), bytes, stream) }
                .map_err(|e| e.to_string())?;
        }
        device
            .record_event(done, stream)
            .map_err(|e| e.to_string())?;
        device.synchronize_event(done).map_err(|e| e.to_string())?;
        Ok((n * bytes) as f64 / start.elapsed().as_secs_f64().max(1e-9))
    };
    run(2)?; // warm-up
    let rate = run(copies);
    // SAFETY: every copy completed (synchronized above); each handle is released once.
    unsafe {
        device.destroy_event(done);
        device.destroy_stream(stream);
        device.free(dst);
    }
    rate
}
