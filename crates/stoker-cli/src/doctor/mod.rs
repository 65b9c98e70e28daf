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
//!    px (`pack_probe`); with float output the transform's cost in uint8; for a shuffled
//!    `parquet:` table larger than `parquet_cache`, each stage in `order=quasi_random`; for
//!    `parquet:` text, each stage on its first documents tokenized once (`stoker pack`) and
//!    read as a `tokens:` file;
//! 4. the machine (`machine`): the share of a core one thread gets and the CPU the whole
//!    process gets beside other work, and, when collating copies at memory speed, how far the
//!    memory's bandwidth scales with more threads copying.
//!
//! A model of the pipeline — workers run a sample's stages one after another, each at the share
//! of a core it gets, the process's cores bound the CPU work, memory bandwidth bounds the
//! copies, one thread copies to the device, the consumer takes a batch per step — predicts the
//! throughput of the current settings and of the advised ones; the bottleneck is the limit that
//! binds.
//!
//! `run` and `diagnose` here only put the parts together: `measure` runs the loader and
//! measures, `model` turns the measurements into the bottleneck, the advice and the predicted
//! throughput, and `report` renders the result as a table or as JSON.

pub(crate) mod machine;
pub(crate) mod measure;
pub(crate) mod model;
mod pack_probe;
pub(crate) mod report;
mod timeline;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use stoker_core::transform::Pipeline;
use stoker_core::LoaderOptions;

use measure::{
    float_images, image_probe, is_text, on_token_probe, packed_costs, pipeline_run,
    quasi_random_costs, stage_run, text_sets, tokenized_once, with, Config,
};
use model::{
    advised, analyse, packing_helps, uint8_sets, Alternatives, Change, Machine, Pack, Report,
    TokenizedOnce, PACK_SIDE,
};

/// `stoker doctor`'s arguments.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct DoctorArgs {
    /// The data, as the `source` option spells it: npy:PATH, image_folder:ROOT, tar:PATTERN, ...;
    /// leave it out with --set blend=…
    #[arg(value_name = "SOURCE")]
    pub(crate) source: Option<String>,
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
    /// Samples measured at least in each run (a run also lasts at least half a second, so fast
    /// sources measure more).
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

/// Shortest each of `stoker doctor`'s measurements runs.
const MIN_PHASE: Duration = Duration::from_millis(500);

/// Runs `stoker doctor` and prints its report.
pub(crate) fn run(args: &DoctorArgs) -> Result<(), String> {
    let mut base = LoaderOptions::new();
    if let Some(source) = &args.source {
        base.set("source", source).map_err(|e| e.to_string())?;
    }
    if !args.step_ms.is_finite() || args.step_ms < 0.0 {
        return Err(format!(
            "--step-ms: {} is not a duration in milliseconds",
            args.step_ms
        ));
    }
    if let Some(path) = &args.timeline {
        writable(path)
            .map_err(|e| format!("--timeline {}: cannot write it: {e}", path.display()))?;
    }
    let config = Config {
        step: Duration::from_secs_f64(args.step_ms / 1000.0),
        samples: args.samples.max(1),
        timeline: args.timeline.clone(),
        progress: !args.json && std::io::stderr().is_terminal(),
        phase_limit: Duration::from_secs(20),
        min_phase: MIN_PHASE,
        remote: args.source.as_deref().is_some_and(|s| s.contains("://")),
    };
    let report = diagnose(&base, &args.set, &config)?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report.json()).map_err(|e| e.to_string())?
        );
    } else {
        // What the data is: the source, or the blend set in its place.
        let data = args.source.clone().or_else(|| {
            let blend = args.set.iter().rev().find(|(k, _)| k == "blend");
            blend.map(|(_, v)| format!("blend={v}"))
        });
        print!("{}", report.table(data.as_deref().unwrap_or("no source")));
    }
    if let Some(path) = &args.timeline {
        if !args.json {
            println!("timeline: {}", path.display());
        }
    }
    Ok(())
}

/// `Err` unless a file can be written at `path`, checked before the measurement so that a bad
/// path does not throw its report away; leaves no file that was not there.
fn writable(path: &std::path::Path) -> std::io::Result<()> {
    let existed = path.exists();
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)?;
    if !existed {
        std::fs::remove_file(path)?;
    }
    Ok(())
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
    let uint8_alt = floats.then(|| uint8_sets(&sets));
    let uint8 = if let Some(alt) = &uint8_alt {
        stage_run(&with(base, alt)?, config)
            .ok()
            .map(|(c, _)| c.transform_us)
    } else {
        None
    };
    // A shuffled table larger than its page cache: the stages again in quasi_random's order.
    let quasi_random = quasi_random_costs(&options, config);
    // Text: the stages again on its first documents tokenized once.
    if is_text(&options, &sets) {
        progress.say("measuring the text tokenized once");
    }
    let token_probe = tokenized_once(&options, &sets, config);
    // Packing shrunk: the stages measured on a packed sample of the data, when decoding large
    // images is what the advice would be about.
    let packed = if packing_helps(&costs, images) {
        progress.say("measuring a packed sample");
        packed_costs(
            &options,
            &sets,
            uint8_alt.as_deref(),
            PACK_SIDE as u32,
            config,
        )
        .ok()
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

    let mut report = analyse(
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
            remote: config.remote
                || sets
                    .iter()
                    .any(|(k, v)| (k == "source" || k == "blend") && v.contains("://")),
            gpu_decode: images.is_some() && gpu_decodes(&sets),
            remote_cache: sets.iter().any(|(k, v)| k == "cache_dir" && !v.is_empty()),
            shard_prefetch: sets
                .iter()
                .rev()
                .find(|(k, _)| k == "shard_prefetch")
                .and_then(|(_, v)| v.parse().ok()),
            quasi_random,
            tokenized_once: token_probe.as_ref().map(|(probe, costs)| TokenizedOnce {
                costs: *costs,
                documents: probe.documents,
                text_sets: text_sets(&sets),
            }),
        },
    );
    // Text tokenized once is read as another source, whose pipeline (a sample costs a few
    // microseconds: batch hand-offs weigh) the model of this one does not predict: it is
    // measured on the probe, with the advised settings.
    if let Some((probe, _)) = &token_probe {
        if report
            .advice
            .iter()
            .any(|a| a.change == Change::Pack(Pack::Tokens))
        {
            progress.say("measuring the advised pipeline on the text tokenized once");
            let (after, _) = advised(&sets, &report.advice);
            let measured = pipeline_run(&on_token_probe(probe, &after)?, config, None)?;
            report.predicted_samples_per_s = measured.samples_per_s;
            report.prediction_measured_on = Some(format!(
                "its first {} documents tokenized once",
                probe.documents
            ));
        }
    }
    progress.done();
    Ok(report)
}

/// Whether this machine has a CUDA device and the transform `sets` ask for could run on it with
/// the JPEG decoded there (GPU decoding: crops, resizes and flips, then `normalize` by
/// `gpu_normalize`).
fn gpu_decodes(sets: &[(String, String)]) -> bool {
    if stoker_core::cuda::devices() == 0 {
        return false;
    }
    let last = |key: &str| {
        sets.iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    };
    let dtype = last("dtype").and_then(|v| v.parse().ok());
    let layout = last("layout")
        .and_then(|v| v.parse().ok())
        .unwrap_or_default();
    let Ok(pipeline) = Pipeline::new(last("transform"), dtype, layout) else {
        return false;
    };
    match pipeline.split_for_device() {
        Ok((twin, _)) => twin.device_resize_refusal().is_none(),
        Err(_) => pipeline.device_resize_refusal().is_none(),
    }
}

/// The share of a sample's CPU time in collate above which memory bandwidth is measured.
const COPY_HEAVY: f64 = 0.1;
/// ... and collate copies at least this fast (bytes per microsecond, MB/s): at memory speeds,
/// not spending its time on per-sample overheads.
const COPY_BOUND_MB_S: f64 = 1000.0;

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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::Value;
    use stoker_core::source::tokens::{MegatronWriter, TokenType};

    use super::measure::TEXT_OPTIONS;
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
            min_phase: Duration::ZERO,
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
        assert!(
            v["prediction_measured_on"].is_null(),
            "predicted by the model"
        );
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

    /// A `parquet:` table of 160 small JPEGs in 40 row groups of 4 (a snappy page each, no
    /// dictionary); returns a JPEG's size.
    fn small_table(path: &std::path::Path) -> usize {
        use parquet::basic::Compression;
        use parquet::data_type::{ByteArray, ByteArrayType};
        use parquet::file::properties::WriterProperties;
        use parquet::file::writer::SerializedFileWriter;

        let mut jpeg = Vec::new();
        jpeg_encoder::Encoder::new(&mut jpeg, 90)
            .encode(&[128; 8 * 8 * 3], 8, 8, jpeg_encoder::ColorType::Rgb)
            .unwrap();
        let schema =
            parquet::schema::parser::parse_message_type("message row { required binary image; }")
                .unwrap();
        let props = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_dictionary_enabled(false)
            .build();
        let file = std::fs::File::create(path).unwrap();
        let mut writer =
            SerializedFileWriter::new(file, Arc::new(schema), Arc::new(props)).unwrap();
        for _ in 0..40 {
            let mut group = writer.next_row_group().unwrap();
            let mut column = group.next_column().unwrap().unwrap();
            let images = vec![ByteArray::from(jpeg.clone()); 4];
            column
                .typed::<ByteArrayType>()
                .write_batch(&images, None, None)
                .unwrap();
            column.close().unwrap();
            group.close().unwrap();
        }
        writer.close().unwrap();
        jpeg.len()
    }

    #[test]
    fn quasi_random_is_measured_for_a_shuffled_table_larger_than_its_page_cache() {
        let path =
            std::env::temp_dir().join(format!("stoker-doctor-{}.parquet", std::process::id()));
        let jpeg = small_table(&path);
        let mut base = LoaderOptions::new();
        base.set("source", &format!("parquet:{}", path.display()))
            .unwrap();
        let measured = |kv: &[(&str, &str)]| {
            let mut all = vec![("batch_size", "4"), ("transform", "center_crop(8)")];
            all.extend_from_slice(kv);
            quasi_random_costs(&with(&base, &sets(&all)).unwrap(), &config())
        };
        // A cache of 1 KiB keeps a page or two of the table.
        let (fit, costs) = measured(&[("shuffle", "true"), ("parquet_cache", "1KiB")])
            .expect("measured in quasi_random's order");
        assert_eq!(fit.kept, 1024);
        // Each value plain-encoded with its 4-byte length, and the pages' headers.
        assert!(fit.pages > 160 * (4 + jpeg as u64), "{fit:?}");
        assert!(costs.samples >= 64 && costs.read_us > 0.0, "{costs:?}");
        // Not when the table fits the cache (1 GiB by default), nor when the epoch is not
        // shuffled or already in quasi_random's order.
        assert!(measured(&[("shuffle", "true")]).is_none());
        assert!(measured(&[("parquet_cache", "1KiB")]).is_none());
        assert!(measured(&[
            ("shuffle", "true"),
            ("parquet_cache", "1KiB"),
            ("order", "quasi_random")
        ])
        .is_none());
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn token_sources_are_diagnosed() {
        let dir =
            std::env::temp_dir().join(format!("stoker-doctor-megatron-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let prefix = dir.join("web");
        let mut writer = MegatronWriter::create(&prefix, TokenType::U16).unwrap();
        for d in 0..64i64 {
            let tokens: Vec<i64> = (0..20 + d % 30).map(|t| (d * 31 + t) % 1000).collect();
            writer.add_document(&tokens).unwrap();
        }
        writer.finish().unwrap();
        let mut base = LoaderOptions::new();
        base.set("source", &format!("megatron:{}", prefix.display()))
            .unwrap();
        let report = diagnose(
            &base,
            &sets(&[("seq_len", "16"), ("batch_size", "4"), ("shuffle", "true")]),
            &config(),
        )
        .unwrap();
        assert!(report.costs.read_us > 0.0, "{:?}", report.costs);
        assert_eq!(report.costs.decode_us + report.costs.transform_us, 0.0);
        assert!(report.pipeline.samples_per_s > 0.0);
        // Tokens already: nothing to tokenize once.
        assert!(report.prediction_measured_on.is_none());
        assert!(!report
            .advice
            .iter()
            .any(|a| a.change == Change::Pack(Pack::Tokens)));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn text_tokenized_as_it_is_read_is_advised_tokenized_once() {
        let dir = std::env::temp_dir().join(format!("stoker-doctor-text-{}", std::process::id()));
        let (source, _, tokenizer) = crate::bench::parquet_text::text_in(&dir, 16).unwrap();
        let mut base = LoaderOptions::new();
        base.set("source", &source).unwrap();
        let given = sets(&[
            ("tokenizer", &tokenizer.display().to_string()),
            ("eos_token", "0"),
            ("seq_len", "64"),
            ("shuffle", "true"),
            ("batch_size", "4"),
            ("num_workers", "1"),
        ]);
        let report = diagnose(&base, &given, &config()).unwrap();
        let table = report.table("text");
        let advice = report
            .advice
            .iter()
            .find(|a| a.change == Change::Pack(Pack::Tokens))
            .unwrap_or_else(|| panic!("no advice to tokenize once: {table}"));
        assert_eq!(advice.set, "source=tokens:OUT.npy");
        assert!(
            advice.why.contains(&format!(
                "`stoker pack SOURCE OUT.npy --set tokenizer={} --set eos_token=0`",
                tokenizer.display()
            )),
            "{}",
            advice.why
        );
        // Measured, not modelled: the advised pipeline on the probe, many times faster.
        let on = report.prediction_measured_on.as_deref().unwrap_or_default();
        assert!(on.contains("documents tokenized once"), "{table}");
        assert!(
            report.predicted_samples_per_s > 5.0 * report.pipeline.samples_per_s,
            "{table}"
        );
        // Applied: the tokens file is read without the text's options.
        let (after, pack) = advised(&given, &report.advice);
        assert_eq!(pack, Some(Pack::Tokens));
        assert!(after
            .iter()
            .all(|(k, _)| !TEXT_OPTIONS.contains(&k.as_str())));
        assert!(after.iter().any(|(k, v)| k == "seq_len" && v == "64"));
        std::fs::remove_dir_all(&dir).unwrap();
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
}
