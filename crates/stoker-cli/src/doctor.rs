//! `stoker doctor SOURCE`: where does the time go, what is the bottleneck, and what fixes it.
//!
//! Measurements on a sample of the data, all through the loader itself:
//! 1. each stage alone: the loader with `num_workers=0` builds batches in this thread, so its
//!    per-stage stats are one core's cost per sample of reading, decoding, transforming and
//!    collating, with nothing running beside them; this thread's CPU time splits reading into
//!    CPU work and waiting on I/O;
//! 2. the whole pipeline with the given settings, a simulated training step holding each batch
//!    (`--step-ms`), measuring samples/s, readiness and, with a device, the copy time;
//! 3. what the advice would change: for an image source, the stored image size (headers only);
//!    when decoding large images dominates, each stage again on a sample of them packed at 256
//!    px (`pack_probe`); with float output the transform's cost in uint8;
//! 4. the machine (`machine`): the share of a core one thread gets and the CPU the whole
//!    process gets beside other work, and, when collating copies at memory speed, how far the
//!    memory's bandwidth scales with more threads copying.
//!
//! A model of the pipeline — workers run a sample's stages one after another, each at the share
//! of a core it gets, the process's cores bound the CPU work, memory bandwidth bounds the
//! copies, one thread copies to the device, the consumer takes a batch per step — predicts the
//! throughput of the current settings and of the advised ones; the bottleneck is the limit that
//! binds.

mod machine;
mod pack_probe;
mod timeline;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};
use stoker_core::autotune::process_cpu_ns;
use stoker_core::{FieldKind, Loader, LoaderOptions, Stats};

pub(crate) use machine::{Load, Usage};
use pack_probe::{Probe, PROBE_SAMPLES};

/// `stoker doctor`'s arguments.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct DoctorArgs {
    /// The data, as the `source` option spells it: npy:PATH, image_folder:ROOT, tar:PATTERN, ...
    #[arg(value_name = "SOURCE")]
    pub(crate) source: String,
    /// A loader option as KEY=VALUE (repeat for more), e.g.
    /// --set "transform=random_resized_crop(224) | hflip | normalize(imagenet)". batch_size is
    /// 64 unless set.
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = key_value)]
    pub(crate) set: Vec<(String, String)>,
    /// The training step to simulate: each batch is held this long before the next is asked
    /// for. 0 measures the loader flat out.
    #[arg(long, value_name = "MS", default_value_t = 0.0)]
    pub(crate) step_ms: f64,
    /// Print the report as JSON (keys: bottleneck, stages, pipeline_samples_per_s,
    /// predicted_samples_per_s, advice).
    #[arg(long)]
    pub(crate) json: bool,
    /// Also draw the timeline of the pipeline run (workers' stages, the consumer's waits) as an
    /// SVG picture.
    #[arg(long, value_name = "FILE.svg")]
    pub(crate) timeline: Option<PathBuf>,
    /// Samples measured in each run.
    #[arg(long, value_name = "N", default_value_t = 512)]
    pub(crate) samples: usize,
}

pub(crate) fn key_value(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}` is not KEY=VALUE"))?;
    let k = k.trim();
    if k.is_empty() {
        return Err(format!("`{s}` has an empty key"));
    }
    Ok((k.to_owned(), v.to_owned()))
}

/// Runs `stoker doctor` and prints its report.
pub(crate) fn run(args: &DoctorArgs) -> Result<(), String> {
    let mut base = LoaderOptions::new();
    base.set("source", &args.source)
        .map_err(|e| e.to_string())?;
    if !args.step_ms.is_finite() || args.step_ms < 0.0 {
        return Err(format!(
            "--step-ms: {} is not a duration in milliseconds",
            args.step_ms
        ));
    }
    let config = Config {
        step: Duration::from_secs_f64(args.step_ms / 1000.0),
        samples: args.samples.max(1),
        timeline: args.timeline.clone(),
        progress: !args.json && std::io::stderr().is_terminal(),
        phase_limit: Duration::from_secs(20),
        remote: args.source.contains("://"),
    };
    let report = diagnose(&base, &args.set, &config)?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report.json()).map_err(|e| e.to_string())?
        );
    } else {
        print!("{}", report.table(&args.source));
    }
    if let Some(path) = &args.timeline {
        if !args.json {
            println!("timeline: {}", path.display());
        }
    }
    Ok(())
}

/// How to measure.
pub(crate) struct Config {
    pub(crate) step: Duration,
    pub(crate) samples: usize,
    pub(crate) timeline: Option<PathBuf>,
    pub(crate) progress: bool,
    /// Longest a measurement runs, whatever `samples` says.
    pub(crate) phase_limit: Duration,
    /// The data comes over the network (a URL): caching it helps.
    pub(crate) remote: bool,
}

/// A stage's cost on one core.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StageCost {
    pub(crate) name: &'static str,
    pub(crate) us_per_sample: f64,
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
    fn wall_us(&self) -> f64 {
        self.read_us + self.decode_us + self.transform_us + self.collate_us
    }

    /// A core's time per sample.
    fn cpu_us(&self) -> f64 {
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

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Advice {
    pub(crate) set: String,
    pub(crate) why: String,
    /// What following it changes, as the model assumed (`set` says it in words).
    pub(crate) change: Change,
}

/// What an advice changes, exactly as the model assumed it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Change {
    /// One option set to a value.
    Set(&'static str, String),
    /// uint8 output: `dtype=uint8`, and normalize dropped from the transform (done on the GPU).
    Uint8,
    /// The source packed once (`stoker pack SOURCE OUT`) and read as `packed:OUT`.
    Pack(Pack),
}

/// How to pack the source.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Pack {
    /// `--max-side`: images shrunk to at most this many pixels on a side.
    pub(crate) max_side: Option<u32>,
}

/// The settings `advice` asks for, applied to `sets`: the options to set, and the packing to
/// do first (the source is then `packed:OUT`).
pub(crate) fn advised(
    sets: &[(String, String)],
    advice: &[Advice],
) -> (Vec<(String, String)>, Option<Pack>) {
    let mut out = sets.to_vec();
    let mut pack = None;
    for a in advice {
        match &a.change {
            Change::Set(key, value) => {
                out.retain(|(k, _)| k != key);
                out.push(((*key).to_owned(), value.clone()));
            }
            Change::Uint8 => out = uint8_sets(&out),
            Change::Pack(p) => pack = Some(*p),
        }
    }
    (out, pack)
}

pub(crate) struct Report {
    pub(crate) bottleneck: &'static str,
    pub(crate) stages: Vec<StageCost>,
    pub(crate) costs: Costs,
    pub(crate) pipeline: Pipeline,
    pub(crate) cores: usize,
    /// What this process gets of its cores beside other work, as measured.
    pub(crate) load: Load,
    /// The model's throughput for the settings measured.
    pub(crate) model_samples_per_s: f64,
    /// The model's throughput with the advice applied: the measured rate times the model's
    /// ratio of after to now.
    pub(crate) predicted_samples_per_s: f64,
    /// The model's own throughput with the advice applied, from the stage costs on the cores
    /// this process gets.
    pub(crate) advised_model_samples_per_s: f64,
    pub(crate) advice: Vec<Advice>,
    pub(crate) step: Duration,
}

/// Measures and diagnoses `base` (the source) with the options `sets`.
pub(crate) fn diagnose(
    base: &LoaderOptions,
    sets: &[(String, String)],
    config: &Config,
) -> Result<Report, String> {
    let mut sets = sets.to_vec();
    if !sets.iter().any(|(k, _)| k == "batch_size") {
        sets.push(("batch_size".into(), "64".into()));
    }
    let options = with(base, &sets)?;
    let progress = Phase::new(config.progress);

    progress.say("measuring each stage on one core");
    let (costs, mut load) = stage_run(&options, config)?;

    progress.say("measuring the pipeline");
    let trace = config
        .timeline
        .as_ref()
        .map(|_| std::env::temp_dir().join(format!("stoker-doctor-{}.json", std::process::id())));
    let pipeline = pipeline_run(&options, config, trace.as_deref())?;
    if let (Some(trace), Some(svg)) = (&trace, &config.timeline) {
        let drawn = timeline::render(trace, svg);
        let _ = std::fs::remove_file(trace);
        drawn?;
    }

    // What the advice could change, measured where it can be.
    progress.say("measuring alternatives");
    let images = image_probe(&options)?;
    let floats = float_images(&options, &sets);
    let uint8 = if floats {
        let alt = uint8_sets(&sets);
        stage_run(&with(base, &alt)?, config)
            .ok()
            .map(|(c, _)| c.transform_us)
    } else {
        None
    };
    // Packing shrunk: the stages measured on a packed sample of the data, when decoding large
    // images is what the advice would be about.
    let packed = if packing_helps(&costs, images) {
        progress.say("measuring a packed sample");
        packed_costs(&options, &sets, floats, config).ok()
    } else {
        None
    };
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    progress.say("measuring the CPU this process gets");
    (load.on_cpu, load.available) = machine::probe_cpu(cores);
    // Copying samples into batches shares the memory's bandwidth: measured when it is a
    // sizeable part of the work.
    let copy_parallelism = if costs.collate_us >= COPY_HEAVY * costs.cpu_us()
        && costs.bytes_per_sample / costs.collate_us.max(1e-9) >= COPY_BOUND_MB_S
    {
        progress.say("measuring memory bandwidth");
        machine::copy_parallelism(cores)
    } else {
        f64::INFINITY
    };
    progress.done();

    Ok(analyse(
        costs,
        pipeline,
        Machine {
            cores,
            load,
            copy_parallelism,
        },
        config.step,
        &Alternatives {
            mean_size: images,
            uint8_transform_us: uint8,
            packed,
            remote: config.remote || sets.iter().any(|(k, v)| k == "source" && v.contains("://")),
            remote_cache: sets.iter().any(|(k, v)| k == "cache_dir" && !v.is_empty()),
            shard_prefetch: sets
                .iter()
                .rev()
                .find(|(k, _)| k == "shard_prefetch")
                .and_then(|(_, v)| v.parse().ok()),
        },
    ))
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

/// A spinner on a terminal; nothing otherwise.
struct Phase(Option<ProgressBar>);

impl Phase {
    fn new(on: bool) -> Phase {
        Phase(on.then(|| {
            let bar = ProgressBar::new_spinner();
            if let Ok(style) = ProgressStyle::with_template("{spinner} stoker doctor: {msg}") {
                bar.set_style(style);
            }
            bar.enable_steady_tick(Duration::from_millis(100));
            bar
        }))
    }

    fn say(&self, msg: &str) {
        if let Some(bar) = &self.0 {
            bar.set_message(msg.to_owned());
        }
    }

    fn done(&self) {
        if let Some(bar) = &self.0 {
            bar.finish_and_clear();
        }
    }
}

/// This thread's time on a CPU and waiting for one (runnable but not running: cores shared with
/// other work), from Linux's schedstat; without it, the CPU time alone.
fn thread_times() -> (Duration, Duration) {
    let sched = std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(|f| f.parse::<u64>().ok());
            Some((it.next()??, it.next()??))
        });
    match sched {
        Some((run, wait)) => (Duration::from_nanos(run), Duration::from_nanos(wait)),
        None => (thread_cpu(), Duration::ZERO),
    }
}

/// This thread's CPU time.
pub(crate) fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant Linux defines.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Asks for batches until `samples` more were delivered (or `limit` passed), calling `hold`
/// with each; ends of epochs are passed over.
fn consume(
    loader: &mut Loader,
    samples: usize,
    min_batches: usize,
    limit: Duration,
    mut hold: impl FnMut(),
) -> Result<(), String> {
    let start = Instant::now();
    let (mut got, mut batches, mut empty_epochs) = (0, 0, 0);
    while (got < samples || batches < min_batches) && start.elapsed() < limit {
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
fn stage_run(options: &LoaderOptions, config: &Config) -> Result<(Costs, Load), String> {
    let mut o = options.clone();
    for (k, v) in [("num_workers", "0"), ("device", "cpu"), ("trace", "")] {
        o.set(k, v).map_err(|e| e.to_string())?;
    }
    let mut loader = Loader::new(&o).map_err(|e| e.to_string())?;
    // One batch first: the first touches of memory and files are not the steady state.
    consume(&mut loader, 1, 1, config.phase_limit, || {})?;
    let (s0, (cpu0, queued0)) = (loader.stats(), thread_times());
    let usage = Usage::start();
    consume(&mut loader, config.samples, 1, config.phase_limit, || {})?;
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
    consume(&mut loader, 1, warm.max(1), config.phase_limit, || {})?;
    let (s0, t0, cpu0) = (loader.stats(), Instant::now(), process_cpu_ns());
    let step = config.step;
    consume(&mut loader, config.samples, 8, config.phase_limit, || {
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
fn image_probe(options: &LoaderOptions) -> Result<Option<(f64, f64)>, String> {
    let Some(spec) = options.source() else {
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
fn float_images(options: &LoaderOptions, sets: &[(String, String)]) -> bool {
    let has_images = options.source().is_some_and(|spec| {
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

/// The same settings with uint8 output: normalize left to the GPU.
fn uint8_sets(sets: &[(String, String)]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = sets
        .iter()
        .filter(|(k, _)| k != "dtype")
        .map(|(k, v)| {
            if k == "transform" {
                let kept: Vec<&str> = v
                    .split('|')
                    .map(str::trim)
                    .filter(|op| !op.starts_with("normalize"))
                    .collect();
                (k.clone(), kept.join(" | "))
            } else {
                (k.clone(), v.clone())
            }
        })
        .collect();
    out.push(("dtype".into(), "uint8".into()));
    out
}

/// Whether decoding large images costs the most: packing them smaller is then advised.
fn packing_helps(costs: &Costs, mean_size: Option<(f64, f64)>) -> bool {
    let decode_heaviest = [
        costs.read_us - costs.io_wait_us,
        costs.transform_us,
        costs.collate_us,
    ]
    .iter()
    .all(|&c| costs.decode_us >= c);
    decode_heaviest && mean_size.is_some_and(|(w, h)| w.max(h) > PACK_SIDE * 1.2)
}

/// One core's cost of each stage on a sample of the source packed at [`PACK_SIDE`], and of
/// the transform with uint8 output when `floats`.
fn packed_costs(
    options: &LoaderOptions,
    sets: &[(String, String)],
    floats: bool,
    config: &Config,
) -> Result<PackedCosts, String> {
    let spec = options.source().ok_or("no source")?;
    let source = spec.open(None, true).map_err(|e| e.to_string())?;
    let samples = PROBE_SAMPLES.max(options.batch_size());
    let probe = Probe::pack(source, samples, PACK_SIDE as u32)?;
    // The same settings, the probe as the source.
    let on_probe = |sets: &[(String, String)]| -> Result<Costs, String> {
        let mut o = with(options, sets)?;
        o.set("source", &probe.spec()).map_err(|e| e.to_string())?;
        Ok(stage_run(&o, config)?.0)
    };
    let costs = on_probe(sets)?;
    let uint8_transform_us = if floats {
        on_probe(&uint8_sets(sets)).ok().map(|c| c.transform_us)
    } else {
        None
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

/// What could change and by how much, as measured.
#[derive(Clone, Debug, Default)]
pub(crate) struct Alternatives {
    /// Mean stored image width and height.
    pub(crate) mean_size: Option<(f64, f64)>,
    /// The transform's cost per sample with uint8 output.
    pub(crate) uint8_transform_us: Option<f64>,
    /// The stages' costs on a sample packed at [`PACK_SIDE`].
    pub(crate) packed: Option<PackedCosts>,
    pub(crate) remote: bool,
    /// Remote shards: whether `cache_dir` is set, and `shard_prefetch` as set.
    pub(crate) remote_cache: bool,
    pub(crate) shard_prefetch: Option<usize>,
}

/// Remote shard downloads in flight that hid 50 ms per request behind decoding in the
/// benchmark (`bench/remote_shards.sh --shards 64`: a cold epoch 1 at 0.51x of local tar with
/// 2, 0.74x with 8, 0.90x with 16; streaming from a `wids` index 0.81-0.88x with 2, 0.92x
/// with 16).
const ADVISED_SHARD_PREFETCH: usize = 16;

/// Where the cache advice suggests putting the cache: a path the user replaces.
const CACHE_DIR_EXAMPLE: &str = "/local/disk/stoker-cache";

/// The side packing would store images at.
const PACK_SIDE: f64 = 256.0;
/// The share of a sample's CPU time in collate above which memory bandwidth is measured.
const COPY_HEAVY: f64 = 0.1;
/// ... and collate copies at least this fast (bytes per microsecond, MB/s): at memory speeds,
/// not spending its time on per-sample overheads.
const COPY_BOUND_MB_S: f64 = 1000.0;
/// Readiness above which the loader keeps up with the consumer.
const KEEPS_UP: f64 = 0.9;
/// Workers busy less than this of the time are mostly idle.
const IDLE_WORKERS: f64 = 0.5;

/// The cores the workers run on, the other work on them, and the memory they share.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Machine {
    pub(crate) cores: usize,
    pub(crate) load: Load,
    /// Threads' worth of copying the memory sustains with a worker on every core (infinite:
    /// not measured, copying is too small a part of the work to matter).
    pub(crate) copy_parallelism: f64,
}

/// The model: each limit on throughput, in samples/s.
#[derive(Clone, Copy, Debug)]
struct Limits {
    workers: f64,
    cores: f64,
    /// Collating copies samples into batch memory: bound by the bandwidth the workers share.
    memory: f64,
    transfer: f64,
    consumer: f64,
}

impl Limits {
    fn of(
        costs: &Costs,
        workers: usize,
        machine: Machine,
        h2d_us: Option<f64>,
        consumer: f64,
    ) -> Limits {
        let (cpu, wall) = (costs.cpu_us().max(1e-3), costs.wall_us().max(1e-3));
        let cores = machine.cores.max(1);
        // A worker needs a core for its CPU work and none while it waits on I/O; beside other
        // work (and beyond the cores) it gets a share of one, and its CPU work stretches.
        let runnable = workers as f64 * cpu / wall;
        let share = machine.load.share(runnable, cores);
        Limits {
            workers: workers as f64 * 1e6 / (costs.io_wait_us + cpu / share),
            // What the cores give this process with a worker on each.
            cores: machine.load.cores_for(cores as f64, cores) * 1e6 / cpu,
            memory: (workers as f64).min(machine.copy_parallelism) * 1e6
                / costs.collate_us.max(1e-3),
            transfer: h2d_us.map_or(f64::INFINITY, |h| 1e6 / h.max(1e-3)),
            consumer,
        }
    }

    fn rate(&self) -> f64 {
        self.workers
            .min(self.cores)
            .min(self.memory)
            .min(self.transfer)
            .min(self.consumer)
    }
}

fn analyse(
    costs: Costs,
    pipeline: Pipeline,
    machine: Machine,
    step: Duration,
    alt: &Alternatives,
) -> Report {
    let cores = machine.cores;
    let batch = pipeline.batch_size.max(1) as f64;
    let consumer = if step.is_zero() {
        f64::INFINITY
    } else {
        batch / step.as_secs_f64()
    };
    let w = pipeline.workers;
    let limits = Limits::of(&costs, w, machine, pipeline.h2d_us, consumer);
    let model = limits.rate();

    // The stage with the largest CPU cost, in the bottleneck's words.
    let cpu_stages = [
        ("io", costs.read_us - costs.io_wait_us),
        ("decode", costs.decode_us),
        ("transform", costs.transform_us),
        ("collate", costs.collate_us),
    ];
    let heaviest = cpu_stages
        .iter()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map_or("io", |s| s.0);
    let io_share = costs.io_wait_us / costs.wall_us().max(1e-9);
    // The loader keeps up when the consumer rarely waits — or when it waits although the
    // workers were mostly idle and the stages could feed it twice over: those waits are the
    // scheduler's (a loaded machine wakes the consumer late), not work the loader owes.
    let loader_rate = limits
        .workers
        .min(limits.cores)
        .min(limits.memory)
        .min(limits.transfer);
    let keeps_up = !step.is_zero()
        && (pipeline.readiness >= KEEPS_UP
            || (pipeline.worker_busy < IDLE_WORKERS && loader_rate >= 2.0 * consumer));
    let bottleneck = if keeps_up {
        "consumer"
    } else if limits.transfer <= limits.workers.min(limits.cores) {
        "transfer"
    } else if io_share > 0.5 {
        "io"
    } else if w < cores
        && limits.workers.min(limits.memory)
            < 0.9
                * limits
                    .cores
                    .min(Limits::of(&costs, cores, machine, None, consumer).memory)
    {
        // A worker on every core would be faster, the memory's bandwidth permitting.
        "workers"
    } else {
        heaviest
    };

    // Advice, each applied to the model in turn.
    let mut advice = Vec::new();
    let mut after = costs;
    let mut workers = w;
    let wanted = |costs: &Costs, target: f64| (target * costs.wall_us() / 1e6).ceil() as usize;
    match bottleneck {
        "consumer" => {
            // Enough workers to keep up, with a margin; the rest of the cores go to training.
            let enough = wanted(&costs, consumer * 1.25).clamp(1, cores.max(1));
            if enough < w {
                advice.push(Advice {
                    set: format!("num_workers={enough}"),
                    why: format!(
                        "the loader keeps up (readiness {:.0}%): the training step is the bottleneck; {enough} workers suffice and leave {} cores to the trainer",
                        pipeline.readiness * 100.0,
                        w - enough
                    ),
                    change: Change::Set("num_workers", enough.to_string()),
                });
                workers = enough;
            }
        }
        "io" => {
            // Threads waiting on I/O use no core: more of them overlap more waits.
            let target = limits.cores.min(limits.transfer).min(consumer);
            let more = wanted(&costs, target).clamp(w + 1, (4 * cores).max(w + 1));
            advice.push(Advice {
                set: format!("num_workers={more}"),
                why: format!(
                    "reads wait on I/O {:.0}% of a sample's time ({:.0} us of {:.0} us); threads waiting on I/O use no core, so more of them overlap more reads",
                    io_share * 100.0,
                    costs.io_wait_us,
                    costs.wall_us()
                ),
                change: Change::Set("num_workers", more.to_string()),
            });
            workers = more;
            if !alt.remote {
                advice.push(Advice {
                    set: "source=packed:OUT".into(),
                    why: "pack the data once (`stoker pack SOURCE OUT`): large sequential shards read with fewer, longer I/Os than one file per sample".into(),
                    change: Change::Pack(Pack { max_side: None }),
                });
            }
        }
        "workers" => {
            advice.push(Advice {
                set: format!("num_workers={cores}"),
                why: format!(
                    "{w} workers use {w} of {cores} cores; the others are idle while the consumer waits (readiness {:.0}%)",
                    pipeline.readiness * 100.0
                ),
                change: Change::Set("num_workers", cores.to_string()),
            });
            workers = cores;
        }
        _ => {}
    }
    let mut packed = None;
    if bottleneck == "decode" || (bottleneck == "workers" && heaviest == "decode") {
        if let Some((w, h)) = alt.mean_size {
            let side = w.max(h);
            if side > PACK_SIDE * 1.2 {
                let factor = (PACK_SIDE / side).powi(2);
                let measured = match &alt.packed {
                    // Measured on a packed sample: decoding, and also the transform (a smaller
                    // crop to resample) and reading (a record of one mapped file).
                    Some(p) => {
                        after = Costs {
                            samples: costs.samples,
                            ..p.costs
                        };
                        packed = Some(p);
                        format!(
                            "; on a sample packed so, a sample costs {:.0} us on a core against {:.0} us",
                            p.costs.cpu_us(),
                            costs.cpu_us()
                        )
                    }
                    // Decoding costs about the same per pixel.
                    None => {
                        after.decode_us *= factor;
                        String::new()
                    }
                };
                advice.push(Advice {
                    set: "source=packed:OUT".into(),
                    why: format!(
                        "decode is {:.0}% of a sample's time and images average {w:.0}x{h:.0} px; `stoker pack SOURCE OUT --max-side {PACK_SIDE}` stores them at most {PACK_SIDE} px on a side, about {:.1}x fewer pixels to decode{measured}",
                        costs.decode_us / costs.wall_us().max(1e-9) * 100.0,
                        1.0 / factor
                    ),
                    change: Change::Pack(Pack {
                        max_side: Some(PACK_SIDE as u32),
                    }),
                });
            }
        }
    }
    if let Some(uint8_us) = alt.uint8_transform_us {
        let share = costs.transform_us / costs.wall_us().max(1e-9);
        if bottleneck != "consumer"
            && bottleneck != "io"
            && (share >= 0.2 || matches!(bottleneck, "transform" | "collate" | "transfer"))
            && uint8_us < costs.transform_us * 0.85
        {
            // On packed data, the uint8 transform measured there.
            after.transform_us = match packed {
                Some(p) => p.uint8_transform_us.unwrap_or(after.transform_us),
                None => uint8_us,
            };
            advice.push(Advice {
                set: "dtype=uint8".into(),
                why: format!(
                    "float output costs {:.0} us per sample in the transform against {:.0} us for uint8, and 4x the bytes to copy; normalize on the GPU instead (x.float().sub_(mean).div_(std))",
                    costs.transform_us, uint8_us
                ),
                change: Change::Uint8,
            });
        }
    }
    // Remote shards are downloaded while the loader opens: more downloads in flight hide the
    // store's latency, and a shared cache spares the next loader (and the other ranks) the
    // download.
    if alt.remote {
        if alt.shard_prefetch.unwrap_or(2) < ADVISED_SHARD_PREFETCH {
            advice.push(Advice {
                set: format!("shard_prefetch={ADVISED_SHARD_PREFETCH}"),
                why: "a loader on remote shards opens once they are in the cache (or, streaming from a wids index, reads each as it downloads); with more downloads in flight, each request's latency overlaps the others'".into(),
                change: Change::Set("shard_prefetch", ADVISED_SHARD_PREFETCH.to_string()),
            });
        }
        if !alt.remote_cache {
            advice.push(Advice {
                set: format!("cache_dir={CACHE_DIR_EXAMPLE}"),
                why: "without a cache directory every loader downloads the shards again into a private temporary one; with it, later loaders and the other ranks of this node read the local copies".into(),
                change: Change::Set("cache_dir", CACHE_DIR_EXAMPLE.into()),
            });
        }
    }
    // Bursty delivery: the loader is fast enough on average yet the consumer waits.
    if !step.is_zero()
        && bottleneck != "consumer"
        && limits.workers.min(limits.cores).min(limits.transfer) > consumer * 1.1
        && pipeline.readiness < KEEPS_UP
    {
        advice.push(Advice {
            set: "prefetch_factor=4".into(),
            why: format!(
                "the workers are faster than the step on average yet the consumer waits (readiness {:.0}%): more batches in flight absorb slow ones",
                pipeline.readiness * 100.0
            ),
            change: Change::Set("prefetch_factor", "4".into()),
        });
    }
    // The model's ratio applied to the measured rate: on a machine whose cores are shared with
    // other work, absolute rates are lower than the model's but the gains carry over.
    // The loader's own limits scale; the consumer's step is an absolute cap.
    let loader_now = Limits::of(&costs, w, machine, pipeline.h2d_us, f64::INFINITY).rate();
    let loader_after = Limits::of(&after, workers, machine, pipeline.h2d_us, f64::INFINITY).rate();
    let predicted = if loader_now > 0.0 && loader_now.is_finite() && pipeline.samples_per_s > 0.0 {
        pipeline.samples_per_s * loader_after / loader_now
    } else {
        loader_after
    }
    .min(consumer)
    .max(pipeline.samples_per_s.min(consumer));

    let mut stages = vec![
        StageCost {
            name: "io",
            us_per_sample: costs.read_us,
        },
        StageCost {
            name: "decode",
            us_per_sample: costs.decode_us,
        },
        StageCost {
            name: "transform",
            us_per_sample: costs.transform_us,
        },
        StageCost {
            name: "collate",
            us_per_sample: costs.collate_us,
        },
    ];
    if let Some(h) = pipeline.h2d_us {
        stages.push(StageCost {
            name: "transfer",
            us_per_sample: h,
        });
    }
    Report {
        bottleneck,
        stages,
        costs,
        pipeline,
        cores,
        load: machine.load,
        model_samples_per_s: model,
        predicted_samples_per_s: predicted,
        advised_model_samples_per_s: loader_after.min(consumer),
        advice,
        step,
    }
}

fn per_s(us: f64) -> f64 {
    if us > 0.0 {
        1e6 / us
    } else {
        f64::INFINITY
    }
}

/// A number for JSON: infinity (a stage that costs nothing) becomes null.
fn num(x: f64) -> Value {
    if x.is_finite() {
        json!((x * 100.0).round() / 100.0)
    } else {
        Value::Null
    }
}

impl Report {
    pub(crate) fn json(&self) -> Value {
        let stages: serde_json::Map<String, Value> = self
            .stages
            .iter()
            .map(|s| {
                (
                    s.name.to_owned(),
                    json!({"us_per_sample": num(s.us_per_sample), "samples_per_s": num(per_s(s.us_per_sample))}),
                )
            })
            .collect();
        json!({
            "bottleneck": self.bottleneck,
            "stages": stages,
            "io_wait_us_per_sample": num(self.costs.io_wait_us),
            "pipeline_samples_per_s": num(self.pipeline.samples_per_s),
            "model_samples_per_s": num(self.model_samples_per_s),
            "predicted_samples_per_s": num(self.predicted_samples_per_s),
            "readiness": num(self.pipeline.readiness),
            "cpu_cores_used": num(self.pipeline.cpu_cores),
            "cores_available": num(self.load.cores_for(self.cores as f64, self.cores)),
            "others_cores_used": num(self.load.others_cores),
            "num_workers": self.pipeline.workers,
            "cores": self.cores,
            "batch_size": self.pipeline.batch_size,
            "step_ms": num(self.step.as_secs_f64() * 1e3),
            "samples_measured": self.costs.samples,
            "advice": self.advice.iter().map(|a| json!({"set": a.set, "why": a.why})).collect::<Vec<_>>(),
        })
    }

    /// The terminal report: a table of stages with a bar chart, then the verdict.
    pub(crate) fn table(&self, source: &str) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "stoker doctor: {source}\n  batch_size {}, {} workers on {} cores, step {} ms, {} samples per stage measured\n",
            self.pipeline.batch_size,
            self.pipeline.workers,
            self.cores,
            self.step.as_millis(),
            self.costs.samples
        );
        let widest = self
            .stages
            .iter()
            .map(|s| s.us_per_sample)
            .fold(0.0f64, f64::max)
            .max(1e-9);
        let _ = writeln!(
            out,
            "  {:<10} {:>12} {:>16}   one core's time per sample",
            "stage", "us/sample", "samples/s/core"
        );
        for s in &self.stages {
            let bar = bar(s.us_per_sample / widest, 30);
            let mark = if s.name == self.bottleneck { " <" } else { "" };
            let _ = writeln!(
                out,
                "  {:<10} {:>12.1} {:>16}   {bar}{mark}",
                s.name,
                s.us_per_sample,
                fmt_rate(per_s(s.us_per_sample))
            );
        }
        if self.costs.io_wait_us > 0.0 {
            let _ = writeln!(
                out,
                "  (of io: {:.1} us waiting on I/O, not using a core)",
                self.costs.io_wait_us
            );
        }
        let _ = writeln!(
            out,
            "\n  pipeline   {} samples/s measured (readiness {:.0}%, workers {:.0}% busy, {:.1} of {} cores used)",
            fmt_rate(self.pipeline.samples_per_s),
            self.pipeline.readiness * 100.0,
            self.pipeline.worker_busy * 100.0,
            self.pipeline.cpu_cores,
            self.cores,
        );
        let available = self.load.cores_for(self.cores as f64, self.cores);
        if available < self.cores as f64 - 0.05 {
            let _ = writeln!(
                out,
                "  model      {} samples/s from the stage costs on the {available:.1} of {} cores this process gets (other work used {:.1})",
                fmt_rate(self.model_samples_per_s),
                self.cores,
                self.load.others_cores
            );
        } else {
            let _ = writeln!(
                out,
                "  model      {} samples/s from the stage costs on {} free cores",
                fmt_rate(self.model_samples_per_s),
                self.cores
            );
        }
        // Busy workers that got little CPU: other processes hold the cores.
        let wanted = self.pipeline.worker_busy * self.pipeline.workers.min(self.cores) as f64;
        if self.pipeline.cpu_cores > 0.0 && self.pipeline.cpu_cores < 0.7 * wanted {
            let _ = writeln!(
                out,
                "  note       the workers were busy on {wanted:.1} cores but the process got {:.1}: other work shares this machine's cores, so rates here are below what free cores give",
                self.pipeline.cpu_cores
            );
        }
        let _ = writeln!(out, "  bottleneck {}", describe(self.bottleneck));
        if self.advice.is_empty() {
            let _ = writeln!(out, "  advice     none: the settings fit this machine");
        } else {
            let _ = writeln!(out, "  advice");
            for a in &self.advice {
                let _ = writeln!(out, "    {:<26} {}", a.set, a.why);
            }
        }
        let _ = writeln!(
            out,
            "  predicted  {} samples/s with the advice",
            fmt_rate(self.predicted_samples_per_s)
        );
        out
    }
}

fn describe(bottleneck: &str) -> &'static str {
    match bottleneck {
        "io" => "io (reading the data)",
        "decode" => "decode (image decoding)",
        "transform" => "transform (augmentation and conversion)",
        "collate" => "collate (copying into batch memory)",
        "transfer" => "transfer (host-to-device copies)",
        "workers" => "workers (too few for the cores)",
        _ => "consumer (the training step itself; the loader keeps up)",
    }
}

fn bar(fraction: f64, width: usize) -> String {
    const EIGHTHS: [char; 8] = ['▏', '▎', '▍', '▌', '▋', '▊', '▉', '█'];
    let eighths = (fraction.clamp(0.0, 1.0) * width as f64 * 8.0).round() as usize;
    let mut s = "█".repeat(eighths / 8);
    if !eighths.is_multiple_of(8) {
        s.push(EIGHTHS[eighths % 8 - 1]);
    }
    s
}

/// A rate with thousands separators; `-` for infinity.
pub(crate) fn fmt_rate(x: f64) -> String {
    if !x.is_finite() {
        return "-".into();
    }
    let n = x.round() as u64;
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use stoker_core::testing::SlowRead;
    use stoker_core::{DType, MemorySource, Source, SourceSpec};

    use super::*;

    fn config() -> Config {
        Config {
            step: Duration::ZERO,
            samples: 64,
            timeline: None,
            progress: false,
            phase_limit: Duration::from_secs(20),
            remote: false,
        }
    }

    fn custom(source: impl Source + 'static) -> LoaderOptions {
        LoaderOptions::new().with_source(SourceSpec::Custom(Arc::new(source)))
    }

    fn sets(kv: &[(&str, &str)]) -> Vec<(String, String)> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// Large noisy JPEGs: decoding dominates everything else.
    fn big_jpegs(n: usize) -> MemorySource {
        let (w, h) = (1024u16, 768u16);
        let rows = (0..n)
            .map(|i| {
                let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ i as u64;
                let pixels: Vec<u8> = (0..w as usize * h as usize * 3)
                    .map(|_| {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        rng as u8
                    })
                    .collect();
                let mut out = Vec::new();
                jpeg_encoder::Encoder::new(&mut out, 90)
                    .encode(&pixels, w, h, jpeg_encoder::ColorType::Rgb)
                    .unwrap();
                out
            })
            .collect();
        MemorySource::new()
            .with_encoded_images("image", rows)
            .unwrap()
    }

    #[test]
    fn a_slow_read_is_an_io_bottleneck_and_more_workers_are_advised() {
        let rows: Vec<u8> = (0..64 * 16).map(|i| i as u8).collect();
        let source = SlowRead {
            inner: Arc::new(
                MemorySource::new()
                    .with_tensor("x", DType::U8, &[16], rows)
                    .unwrap(),
            ),
            delay: Duration::from_millis(2),
        };
        let report = diagnose(
            &custom(source),
            &sets(&[("batch_size", "8"), ("num_workers", "2")]),
            &config(),
        )
        .unwrap();
        assert_eq!(report.bottleneck, "io", "{}", report.table("slow"));
        assert!(report.costs.io_wait_us > 1500.0, "{:?}", report.costs);
        let workers = report
            .advice
            .iter()
            .find(|a| a.set.starts_with("num_workers="))
            .expect("worker advice");
        let n: usize = workers.set["num_workers=".len()..].parse().unwrap();
        assert!(n > 2, "{workers:?}");
        assert!(report.predicted_samples_per_s > 2.0 * report.pipeline.samples_per_s);
    }

    #[test]
    fn decode_heavy_images_are_a_decode_bottleneck_and_packing_is_advised() {
        let report = diagnose(
            &custom(big_jpegs(12)),
            &sets(&[
                ("batch_size", "4"),
                ("num_workers", "auto"),
                ("transform", "resize(32) | center_crop(32)"),
            ]),
            &Config {
                samples: 16,
                ..config()
            },
        )
        .unwrap();
        assert_eq!(report.bottleneck, "decode", "{}", report.table("jpegs"));
        let pack = report
            .advice
            .iter()
            .find(|a| a.set == "source=packed:OUT")
            .expect("packing advice");
        assert!(pack.why.contains("--max-side 256"), "{pack:?}");
        assert!(pack.why.contains("1024x768"), "{pack:?}");
    }

    #[test]
    fn a_slow_consumer_is_the_bottleneck_when_the_loader_keeps_up() {
        let rows: Vec<u8> = (0..256 * 16).map(|i| i as u8).collect();
        let source = MemorySource::new()
            .with_tensor("x", DType::U8, &[16], rows)
            .unwrap();
        let report = diagnose(
            &custom(source),
            &sets(&[("batch_size", "8"), ("num_workers", "2")]),
            &Config {
                step: Duration::from_millis(5),
                samples: 80,
                ..config()
            },
        )
        .unwrap();
        // Readiness itself is not asserted: a loaded machine wakes the consumer late.
        assert_eq!(report.bottleneck, "consumer", "{}", report.table("fast"));
    }

    #[test]
    fn the_json_report_has_the_documented_keys() {
        let rows: Vec<u8> = (0..64 * 16).map(|i| i as u8).collect();
        let source = MemorySource::new()
            .with_tensor("x", DType::U8, &[16], rows)
            .unwrap();
        let report = diagnose(&custom(source), &sets(&[("batch_size", "8")]), &config()).unwrap();
        let text = serde_json::to_string(&report.json()).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        let bottleneck = v["bottleneck"].as_str().unwrap();
        assert!(
            [
                "io",
                "decode",
                "transform",
                "collate",
                "transfer",
                "workers",
                "consumer"
            ]
            .contains(&bottleneck),
            "{bottleneck}"
        );
        for stage in ["io", "decode", "transform", "collate"] {
            let s = &v["stages"][stage];
            assert!(s["us_per_sample"].is_number(), "{stage}: {s}");
            assert!(s["samples_per_s"].is_number() || s["samples_per_s"].is_null());
        }
        assert!(
            v["stages"].get("transfer").is_none(),
            "no device, no transfer stage"
        );
        assert!(v["pipeline_samples_per_s"].as_f64().unwrap() > 0.0);
        assert!(v["predicted_samples_per_s"].as_f64().unwrap() > 0.0);
        for a in v["advice"].as_array().unwrap() {
            assert!(a["set"].as_str().unwrap().contains('='), "{a}");
            assert!(!a["why"].as_str().unwrap().is_empty());
        }
        // The table names the same bottleneck.
        assert!(report
            .table("x")
            .contains(&format!("bottleneck {bottleneck}")));
    }

    #[test]
    fn the_timeline_of_the_pipeline_run_is_drawn() {
        let svg = std::env::temp_dir().join(format!("stoker-doctor-{}.svg", std::process::id()));
        let rows: Vec<u8> = (0..64 * 16).map(|i| i as u8).collect();
        let source = MemorySource::new()
            .with_tensor("x", DType::U8, &[16], rows)
            .unwrap();
        diagnose(
            &custom(source),
            &sets(&[("batch_size", "8"), ("num_workers", "2")]),
            &Config {
                timeline: Some(svg.clone()),
                ..config()
            },
        )
        .unwrap();
        let picture = std::fs::read_to_string(&svg).unwrap();
        std::fs::remove_file(&svg).unwrap();
        assert!(picture.starts_with("<svg"));
        // Which of the two workers builds the few tiny batches is up to the scheduler (on a busy
        // machine one may build them all); one row per thread is the timeline module's test.
        assert!(picture.contains(">stoker-worker-"));
        assert!(picture.contains(">consumer (next)<"));
        assert!(picture.contains("<title>read ") && picture.contains("<title>wait "));
    }

    #[test]
    fn remote_shards_get_prefetch_and_cache_advice_until_set() {
        let rows: Vec<u8> = (0..64 * 16).map(|i| i as u8).collect();
        let source = || {
            custom(
                MemorySource::new()
                    .with_tensor("x", DType::U8, &[16], rows.clone())
                    .unwrap(),
            )
        };
        let remote = Config {
            remote: true,
            ..config()
        };
        let advised = |report: &Report| -> Vec<String> {
            report.advice.iter().map(|a| a.set.clone()).collect()
        };
        let report = diagnose(&source(), &sets(&[("batch_size", "8")]), &remote).unwrap();
        let sets_advised = advised(&report);
        assert!(
            sets_advised.contains(&"shard_prefetch=16".to_owned()),
            "{sets_advised:?}"
        );
        assert!(
            sets_advised.iter().any(|s| s.starts_with("cache_dir=")),
            "{sets_advised:?}"
        );
        let cache =
            std::env::temp_dir().join(format!("stoker-doctor-cache-{}", std::process::id()));
        let report = diagnose(
            &source(),
            &sets(&[
                ("batch_size", "8"),
                ("shard_prefetch", "16"),
                ("cache_dir", cache.to_str().unwrap()),
            ]),
            &remote,
        )
        .unwrap();
        let sets_advised = advised(&report);
        assert!(
            !sets_advised
                .iter()
                .any(|s| s.starts_with("shard_prefetch=") || s.starts_with("cache_dir=")),
            "{sets_advised:?}"
        );
        // A local source gets neither.
        let report = diagnose(&source(), &sets(&[("batch_size", "8")]), &config()).unwrap();
        assert!(!advised(&report)
            .iter()
            .any(|s| s.starts_with("shard_prefetch=") || s.starts_with("cache_dir=")),);
    }

    #[test]
    fn key_value_arguments() {
        assert_eq!(
            key_value("transform=resize(8) | hflip").unwrap(),
            ("transform".into(), "resize(8) | hflip".into())
        );
        assert_eq!(key_value("pad=").unwrap(), ("pad".into(), "".into()));
        assert!(key_value("batch_size").is_err());
        assert!(key_value("=3").is_err());
    }

    #[test]
    fn uint8_alternative_drops_normalize() {
        let alt = uint8_sets(&sets(&[
            (
                "transform",
                "random_resized_crop(224) | normalize(imagenet) | hflip",
            ),
            ("dtype", "float16"),
        ]));
        assert_eq!(
            alt,
            sets(&[
                ("transform", "random_resized_crop(224) | hflip"),
                ("dtype", "uint8")
            ])
        );
    }

    #[test]
    fn bars_and_rates_read_well() {
        assert_eq!(bar(1.0, 4), "████");
        assert_eq!(bar(0.0, 4), "");
        assert_eq!(bar(0.5 + 1.0 / 64.0, 4), "██▏");
        assert_eq!(fmt_rate(1234567.4), "1,234,567");
        assert_eq!(fmt_rate(999.0), "999");
        assert_eq!(fmt_rate(f64::INFINITY), "-");
    }
}
