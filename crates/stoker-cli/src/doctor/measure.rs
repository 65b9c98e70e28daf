//! Running the loader and measuring it: each stage alone on this thread (`stage_run`), the
//! whole pipeline (`pipeline_run`), the stored images' size (`image_probe`), the stages on a
//! packed sample (`packed_costs`), in `order=quasi_random` (`quasi_random_costs`) and on text
//! tokenized once (`tokenized_once`), giving what the model reasons from (`Costs`,
//! `Pipeline`, `PackedCosts`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use stoker_core::autotune::process_cpu_ns;
use stoker_core::source::PageCacheFit;
use stoker_core::{FieldKind, Loader, LoaderOptions, Order, SourceSpec, Stats};

use super::machine::{thread_times, Load, Usage};
use super::pack_probe::{Probe, TokenProbe, PROBE_SAMPLES};

/// How to measure.
pub(crate) struct Config {
    pub(crate) step: Duration,
    pub(crate) samples: usize,
    pub(crate) timeline: Option<PathBuf>,
    pub(crate) progress: bool,
    /// Longest a measurement runs, whatever `samples` says.
    pub(crate) phase_limit: Duration,
    /// Shortest a measurement runs, whatever `samples` says: 512 samples of tokens take a few
    /// milliseconds, which one hiccup of the scheduler can double.
    pub(crate) min_phase: Duration,
    /// The data comes over the network (a URL): caching it helps.
    pub(crate) remote: bool,
}

/// One core's cost of each stage per sample, from the single-thread run.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Costs {
    pub(crate) read_us: f64,
    /// The part of `read_us` spent waiting (no CPU): I/O latency.
    pub(crate) io_wait_us: f64,
    pub(crate) decode_us: f64,
    pub(crate) transform_us: f64,
    pub(crate) collate_us: f64,
    pub(crate) samples: u64,
    /// Bytes of batch memory per sample.
    pub(crate) bytes_per_sample: f64,
}

impl Costs {
    /// A worker's time per sample.
    pub(super) fn wall_us(&self) -> f64 {
        self.read_us + self.decode_us + self.transform_us + self.collate_us
    }

    /// A core's time per sample.
    pub(super) fn cpu_us(&self) -> f64 {
        self.wall_us() - self.io_wait_us
    }
}

/// The pipeline run.
#[derive(Clone, Debug, Default)]
pub(crate) struct Pipeline {
    pub(crate) samples_per_s: f64,
    pub(crate) readiness: f64,
    pub(crate) workers: usize,
    pub(crate) worker_busy: f64,
    pub(crate) h2d_us: Option<f64>,
    pub(crate) batch_size: usize,
    /// Cores' worth of CPU time the process got (less than the workers asked for when other
    /// work shares the cores).
    pub(crate) cpu_cores: f64,
}

/// `base` with the options `sets` set, in order.
pub(crate) fn with(
    base: &LoaderOptions,
    sets: &[(String, String)],
) -> Result<LoaderOptions, String> {
    let mut o = base.clone();
    for (k, v) in sets {
        o.set(k, v).map_err(|e| e.to_string())?;
    }
    Ok(o)
}

/// Asks for batches until `samples` more were delivered and `at_least` passed (or `limit`
/// passed), calling `hold` with each; ends of epochs are passed over.
fn consume(
    loader: &mut Loader,
    samples: usize,
    min_batches: usize,
    (at_least, limit): (Duration, Duration),
    mut hold: impl FnMut(),
) -> Result<(), String> {
    let start = Instant::now();
    let (mut got, mut batches, mut empty_epochs) = (0, 0, 0);
    while (got < samples || batches < min_batches || start.elapsed() < at_least)
        && start.elapsed() < limit
    {
        match loader.next().map_err(|e| e.to_string())? {
            Some(b) => {
                got += b.len();
                batches += 1;
                empty_epochs = 0;
                hold();
            }
            None => {
                empty_epochs += 1;
                if empty_epochs > 1 {
                    return Err("the source has no batches to measure".into());
                }
            }
        }
    }
    Ok(())
}

/// One core's cost per sample of each stage: the loader building batches in this thread; and
/// the other work on the cores meanwhile.
pub(super) fn stage_run(options: &LoaderOptions, config: &Config) -> Result<(Costs, Load), String> {
    let mut o = options.clone();
    for (k, v) in [("num_workers", "0"), ("device", "cpu"), ("trace", "")] {
        o.set(k, v).map_err(|e| e.to_string())?;
    }
    let mut loader = Loader::new(&o).map_err(|e| e.to_string())?;
    // One batch first: the first touches of memory and files are not the steady state.
    consume(
        &mut loader,
        1,
        1,
        (Duration::ZERO, config.phase_limit),
        || {},
    )?;
    let (s0, (cpu0, queued0)) = (loader.stats(), thread_times());
    let usage = Usage::start();
    let phase = (config.min_phase, config.phase_limit);
    consume(&mut loader, config.samples, 1, phase, || {})?;
    let (s1, (cpu1, queued1)) = (loader.stats(), thread_times());
    // What the cores did besides this process: other work's CPU time.
    let others_cores = usage.others_cores();
    let n = s1.samples.saturating_sub(s0.samples).max(1);
    let per = |a: u64, b: u64| b.saturating_sub(a) as f64 / 1e3 / n as f64;
    let read_us = per(s0.read_ns, s1.read_ns);
    let busy_us = per(s0.busy_ns, s1.busy_ns);
    let cpu_us = (cpu1.saturating_sub(cpu0)).as_nanos() as f64 / 1e3 / n as f64;
    let queued_us = (queued1.saturating_sub(queued0)).as_nanos() as f64 / 1e3 / n as f64;
    // Building is all this thread did: what it spent neither on a CPU nor waiting for one, it
    // waited for I/O.
    let io_wait_us = (busy_us - cpu_us - queued_us).clamp(0.0, read_us);
    // Time spent runnable but not running (cores shared with other work) is no stage's cost:
    // the stages' CPU time is their share of the time on a CPU.
    let on_cpu = if cpu_us + queued_us > 0.0 {
        cpu_us / (cpu_us + queued_us)
    } else {
        1.0
    };
    let costs = Costs {
        read_us: io_wait_us + (read_us - io_wait_us) * on_cpu,
        io_wait_us,
        decode_us: per(s0.decode_ns, s1.decode_ns) * on_cpu,
        transform_us: per(s0.transform_ns, s1.transform_ns) * on_cpu,
        collate_us: per(s0.collate_ns, s1.collate_ns) * on_cpu,
        samples: n,
        bytes_per_sample: s1.batch_bytes as f64 / options.batch_size().max(1) as f64,
    };
    Ok((
        costs,
        Load {
            others_cores,
            // This thread's, until the caller measures it beside the whole process's.
            on_cpu,
            available: f64::INFINITY,
        },
    ))
}

/// The pipeline with the given settings, a step of `config.step` per batch: filled first (as
/// many batches as it holds in flight), then `config.samples` samples (at least 8 batches)
/// measured.
pub(crate) fn pipeline_run(
    options: &LoaderOptions,
    config: &Config,
    trace: Option<&std::path::Path>,
) -> Result<Pipeline, String> {
    let mut o = options.clone();
    if let Some(path) = trace {
        o.set("trace", &path.to_string_lossy())
            .map_err(|e| e.to_string())?;
    }
    let mut loader = Loader::new(&o).map_err(|e| e.to_string())?;
    let warm = loader.stats().in_flight_cap as usize;
    // Fill the pipeline first: its start is not its steady state.
    consume(
        &mut loader,
        1,
        warm.max(1),
        (Duration::ZERO, config.phase_limit),
        || {},
    )?;
    let (s0, t0, cpu0) = (loader.stats(), Instant::now(), process_cpu_ns());
    let step = config.step;
    let phase = (config.min_phase, config.phase_limit);
    consume(&mut loader, config.samples, 8, phase, || {
        std::thread::sleep(step)
    })?;
    let (s1, elapsed, cpu1) = (loader.stats(), t0.elapsed(), process_cpu_ns());
    drop(loader); // writes the trace
    let mut p = pipeline_from(&s0, &s1, elapsed, options.batch_size());
    p.cpu_cores = cpu1.saturating_sub(cpu0) as f64 / 1e9 / elapsed.as_secs_f64().max(1e-9);
    Ok(p)
}

fn pipeline_from(s0: &Stats, s1: &Stats, elapsed: Duration, batch_size: usize) -> Pipeline {
    let secs = elapsed.as_secs_f64().max(1e-9);
    let samples = s1.samples.saturating_sub(s0.samples);
    let wait = s1.wait_ns_total.saturating_sub(s0.wait_ns_total) as f64 / 1e9;
    let busy = s1.busy_ns.saturating_sub(s0.busy_ns) as f64 / 1e9;
    let workers = s1.num_workers.max(1) as usize;
    let h2d = s1.h2d_ns.saturating_sub(s0.h2d_ns);
    Pipeline {
        samples_per_s: samples as f64 / secs,
        readiness: (1.0 - wait / secs).clamp(0.0, 1.0),
        workers,
        worker_busy: (busy / (secs * workers as f64)).clamp(0.0, 1.0),
        h2d_us: (h2d > 0).then(|| h2d as f64 / 1e3 / samples.max(1) as f64),
        batch_size,
        cpu_cores: 0.0,
    }
}

/// Mean width and height of the stored images (headers only), for an image source.
pub(super) fn image_probe(options: &LoaderOptions) -> Result<Option<(f64, f64)>, String> {
    let Some(spec) = options.source().filter(|_| !options.is_token_stream()) else {
        return Ok(None);
    };
    let source = spec.open(None, true).map_err(|e| e.to_string())?;
    let Some(field) = source
        .fields()
        .iter()
        .position(|f| f.kind == FieldKind::EncodedImage)
    else {
        return Ok(None);
    };
    let n = source.len();
    if n == 0 {
        return Ok(None);
    }
    let probes = n.min(32);
    let mut buf = Vec::new();
    let (mut w, mut h, mut seen) = (0f64, 0f64, 0usize);
    for i in 0..probes {
        let index = i * n / probes;
        let Ok(sample) = source.read(index, &mut buf) else {
            continue;
        };
        if let Ok(d) = stoker_core::decode::dimensions(sample.get(field)) {
            w += d.width as f64;
            h += d.height as f64;
            seen += 1;
        }
    }
    Ok((seen > 0).then(|| (w / seen as f64, h / seen as f64)))
}

/// Whether the images come out as floats (normalize, or a float dtype).
pub(super) fn float_images(options: &LoaderOptions, sets: &[(String, String)]) -> bool {
    let has_images = !options.is_token_stream()
        && options.source().is_some_and(|spec| {
            spec.open(None, true)
                .is_ok_and(|s| s.fields().iter().any(|f| f.kind == FieldKind::EncodedImage))
        });
    let dtype = sets
        .iter()
        .rev()
        .find(|(k, _)| k == "dtype")
        .map(|(_, v)| v.as_str());
    let normalizes = sets
        .iter()
        .any(|(k, v)| k == "transform" && v.contains("normalize"));
    has_images && (dtype.is_some_and(|d| d != "uint8") || (dtype.is_none() && normalizes))
}

/// A source shuffled over more decompressed pages than it keeps (a `parquet:` table larger than
/// `parquet_cache`, read in `order=random`): how far it overflows, and each stage's cost read in
/// `order=quasi_random` instead, whose window of pages stays in the cache. `None` when the pages
/// fit, the order is not `random`, or the options do not shuffle without replacement (which
/// `quasi_random` needs, and its loader refuses).
pub(super) fn quasi_random_costs(
    options: &LoaderOptions,
    config: &Config,
) -> Option<(PageCacheFit, Costs)> {
    if options.order() != Order::Random {
        return None;
    }
    let mut o = options.clone();
    o.set("num_workers", "0").ok()?;
    let fit = Loader::new(&o).ok()?.source()?.page_cache()?;
    if fit.pages <= fit.kept {
        return None;
    }
    o.set("order", "quasi_random").ok()?;
    Some((fit, stage_run(&o, config).ok()?.0))
}

/// The options that only a `parquet:` text source takes: what it is tokenized with.
pub(crate) const TEXT_OPTIONS: [&str; 3] = ["tokenizer", "eos_token", "text_column"];

/// Of the options `sets`, those the text is tokenized with ([`TEXT_OPTIONS`]): `stoker pack`
/// takes them, and the `tokens:` file it writes does not.
pub(crate) fn text_sets(sets: &[(String, String)]) -> Vec<(String, String)> {
    sets.iter()
        .filter(|(k, _)| is_text_option(k))
        .cloned()
        .collect()
}

/// The options `sets` less [`TEXT_OPTIONS`]: what reads the text tokenized once.
pub(crate) fn without_text_sets(sets: &[(String, String)]) -> Vec<(String, String)> {
    sets.iter()
        .filter(|(k, _)| !is_text_option(k))
        .cloned()
        .collect()
}

fn is_text_option(key: &str) -> bool {
    TEXT_OPTIONS.contains(&key)
}

/// Tokens a token probe holds at most: tokenizing them takes seconds (a few hundred thousand to
/// a million tokens a core-second); a stage run longer than the probe reads it again.
const MAX_PROBE_TOKENS: u64 = 1 << 22;

/// A `parquet:` text source's first documents tokenized once, as `stoker pack SOURCE OUT.npy`
/// writes them, and each stage's cost reading them as `tokens:OUT.npy` with the same settings
/// less [`TEXT_OPTIONS`] (the token file holds the end-of-document tokens, and its sidecar the
/// documents). `None` for any other source.
pub(super) fn tokenized_once(
    options: &LoaderOptions,
    sets: &[(String, String)],
    config: &Config,
) -> Option<(TokenProbe, Costs)> {
    if !is_text(options, sets) {
        return None;
    }
    // Enough windows for the stage run (a batch first, then `samples`); under
    // `token_packing=pad` a sample is a document, and a probe of fewer is read again.
    let windows = (config.samples + 2 * options.batch_size()) as u64;
    let tokens = (windows * (options.seq_len()? as u64 + 1)).min(MAX_PROBE_TOKENS);
    let probe = TokenProbe::write(&options.open_token_source().ok()?, tokens).ok()?;
    let costs = stage_run(&on_token_probe(&probe, sets).ok()?, config)
        .ok()?
        .0;
    Some((probe, costs))
}

/// Whether the options read one `parquet:` source as text (not a blend of sources).
pub(super) fn is_text(options: &LoaderOptions, sets: &[(String, String)]) -> bool {
    options.is_token_stream()
        && matches!(options.source(), Some(SourceSpec::Parquet(_)))
        && !sets.iter().any(|(k, _)| k == "blend")
}

/// The options `sets` of a text source, reading `probe` (its tokens) instead.
pub(super) fn on_token_probe(
    probe: &TokenProbe,
    sets: &[(String, String)],
) -> Result<LoaderOptions, String> {
    let mut o = LoaderOptions::new();
    o.set("source", probe.spec()).map_err(|e| e.to_string())?;
    let mut kept = without_text_sets(sets);
    kept.retain(|(k, _)| k != "source");
    with(&o, &kept)
}

/// One core's cost of each stage on a sample of the source packed at `side` pixels, and of the
/// transform with the uint8 settings `uint8` when given.
pub(super) fn packed_costs(
    options: &LoaderOptions,
    sets: &[(String, String)],
    uint8: Option<&[(String, String)]>,
    side: u32,
    config: &Config,
) -> Result<PackedCosts, String> {
    let spec = options.source().ok_or("no source")?;
    let source = spec.open(None, true).map_err(|e| e.to_string())?;
    let samples = PROBE_SAMPLES.max(options.batch_size());
    let probe = Probe::pack(source, samples, side)?;
    // The same settings, the probe as the source.
    let on_probe = |sets: &[(String, String)]| -> Result<Costs, String> {
        let mut o = with(options, sets)?;
        o.set("source", &probe.spec()).map_err(|e| e.to_string())?;
        Ok(stage_run(&o, config)?.0)
    };
    let costs = on_probe(sets)?;
    let uint8_transform_us = match uint8 {
        Some(uint8) => on_probe(uint8).ok().map(|c| c.transform_us),
        None => None,
    };
    Ok(PackedCosts {
        costs,
        uint8_transform_us,
    })
}

/// The stages' costs on packed data.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PackedCosts {
    pub(crate) costs: Costs,
    pub(crate) uint8_transform_us: Option<f64>,
}
