//! `stoker bench doctor`: does `stoker doctor`'s prediction hold? For each data shape — small
//! JPEGs (160×120), large JPEGs (1600×1200), an npy file of uint8 `[N,3,224,224]` and, when
//! asked for, a Hugging Face-style Parquet table larger than its page cache — the doctor
//! diagnoses the given settings and predicts the samples/s of the settings it advises (of the
//! given ones when it advises nothing); then a loader runs with exactly those settings (the
//! source packed first when the advice is to pack) and is measured the way the doctor measures
//! a pipeline. The error is the prediction against that measurement; the target is 15%.
//!
//! Each round runs the doctor and then its check for every shape in turn. Other work on a shared
//! machine only ever makes a loader slower, so the best prediction and the best check over the
//! rounds are compared (among the rounds that checked the settings advised most often); every
//! round is in the JSON, with the CPU other work used during the doctor and during the check.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};
use stoker_core::options::QUASI_RANDOM_WINDOW_PAGES;
use stoker_core::pack::{open_source, pack, PackOptions};
use stoker_core::LoaderOptions;

use super::{parquet_table, parquet_text, BenchData};
use crate::doctor::machine::Usage;
use crate::doctor::measure::{self, text_sets, Config};
use crate::doctor::model::{Pack, Report};
use crate::doctor::report::fmt_rate;
use crate::doctor::{self, model};
use crate::pack::open_tokens;
use crate::photos::{photos_or_drawn, Size};
use crate::workers::workers;

/// The largest error of a prediction that passes, in percent.
const TARGET_PCT: f64 = 15.0;
/// npy batches hold this many times the JPEG batch size (its samples cost far less).
const NPY_BATCH_FACTOR: usize = 4;
/// The text shape's windows and batches: nanoGPT's `block_size` and `batch_size`.
const TEXT_SEQ_LEN: usize = 1024;
const TEXT_BATCH: usize = 12;

/// One data shape and the settings the doctor is given for it.
struct Shape {
    key: &'static str,
    name: String,
    /// How the data was made, when that is worth saying (drawn images, and why).
    note: Option<String>,
    /// The folder or file the source reads, and its spec.
    path: PathBuf,
    source: String,
    /// Whether `stoker pack` can shrink it (it holds images).
    images: bool,
    sets: Vec<(String, String)>,
    batch_size: usize,
    /// Packed copies made so far, by `--max-side`.
    packed: Vec<(Option<u32>, String)>,
    rounds: Vec<Round>,
}

/// One round of one shape: the doctor's verdict and the check of its prediction.
struct Round {
    bottleneck: &'static str,
    advice: Vec<String>,
    checked: Vec<String>,
    /// The doctor's pipeline run, with the given settings.
    doctor_samples_per_s: f64,
    predicted: f64,
    /// The model alone (stage costs on free cores) for the checked settings.
    model: f64,
    measured: f64,
    /// Cores' worth of CPU the process got during the check.
    measured_cores: f64,
    /// Cores' worth of CPU other work used while the doctor measured the stages, and during
    /// the check.
    others_doctor: f64,
    others_check: f64,
    /// Cores' worth of CPU the doctor found this process gets with a thread on every core.
    available: f64,
}

impl Round {
    fn error_pct(&self) -> f64 {
        (self.predicted - self.measured) / self.measured.max(1e-9) * 100.0
    }
}

/// `stoker bench doctor`'s arguments.
#[derive(Debug, clap::Args)]
pub(crate) struct DoctorBenchArgs {
    /// A shorter run: smaller folders, fewer samples, one round.
    #[arg(long)]
    pub(crate) quick: bool,
    // The doc comment is the flag's --help text, where the shape in brackets is plain text, not
    // a link to an item.
    #[allow(rustdoc::broken_intra_doc_links)]
    /// The data shapes to check, comma-separated: small (160x120 JPEGs), large (1600x1200
    /// JPEGs), npy (uint8 [N,3,224,224]), parquet (160x120 JPEGs as a Hugging Face Parquet
    /// table in row groups of 100, read shuffled with a parquet_cache of one and a half
    /// quasi_random windows), text (Parquet text tokenized by a byte-level BPE as it is read,
    /// shuffled windows of 1,024 tokens in batches of 12).
    #[arg(long, value_name = "LIST", value_delimiter = ',', default_value = "small,large,npy",
          value_parser = ["small", "large", "npy", "parquet", "text"])]
    pub(crate) shapes: Vec<String>,
    /// Rounds over the shapes (each: the doctor, then the check); the round with the fastest
    /// check is shown [default: 2, --quick 1].
    #[arg(long, value_name = "N")]
    pub(crate) rounds: Option<usize>,
    /// Images in each JPEG folder [default: 1200 small, 240 large, 1280 parquet; --quick 480,
    /// 96, 480].
    #[arg(long, value_name = "N")]
    pub(crate) images: Option<usize>,
    /// Samples in the npy file [default: 2048, --quick 1024].
    #[arg(long, value_name = "N")]
    pub(crate) npy_samples: Option<usize>,
    /// Rows of the Parquet table, the folder's images in turn; more than 32 row groups of 100
    /// [default: 32000, --quick 9600].
    #[arg(long, value_name = "N")]
    pub(crate) table_rows: Option<usize>,
    /// Documents of the text, 40 to 600 words each [default: 8000, --quick 2000].
    #[arg(long, value_name = "N")]
    pub(crate) text_rows: Option<usize>,
    /// Seconds each measurement runs — each of the doctor's, and the check after filling the
    /// pipeline (at least 8 batches) [default: 2, --quick 1].
    #[arg(long, value_name = "S")]
    pub(crate) seconds: Option<f64>,
    /// Samples per JPEG batch; npy batches are four times larger.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub(crate) batch_size: usize,
    /// Workers the doctor is given: with fewer than the cores it advises more, and that
    /// prediction is checked too.
    #[arg(long = "workers", value_name = "N|auto", default_value = "1", value_parser = workers)]
    pub(crate) workers: String,
    /// The training step to simulate, in milliseconds per batch.
    #[arg(long, value_name = "MS", default_value_t = 0.0)]
    pub(crate) step_ms: f64,
    #[command(flatten)]
    pub(crate) data: BenchData,
    /// Print the results as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

pub(crate) fn run(args: &DoctorBenchArgs) -> Result<(), String> {
    if !args.step_ms.is_finite() || args.step_ms < 0.0 {
        return Err(format!(
            "--step-ms: {} is not a duration in milliseconds",
            args.step_ms
        ));
    }
    let quick = args.quick;
    let rounds = args.rounds.unwrap_or(if quick { 1 } else { 2 }).max(1);
    let seconds = args.seconds.unwrap_or(if quick { 1.0 } else { 2.0 });
    if !seconds.is_finite() || seconds <= 0.0 {
        return Err(format!("--seconds: {seconds} is not a positive duration"));
    }
    let phase = Duration::from_secs_f64(seconds);
    let batch_size = args.batch_size.max(1);
    let dir = args
        .data
        .data_dir
        .clone()
        .unwrap_or_else(crate::photos::cache_dir);
    let mut shapes = Vec::new();
    for key in &args.shapes {
        if shapes.iter().any(|s: &Shape| s.key == key) {
            continue;
        }
        shapes.push(make_shape(key, args, &dir, batch_size, quick)?);
    }
    let step = Duration::from_secs_f64(args.step_ms / 1000.0);
    for round in 0..rounds {
        for shape in &mut shapes {
            eprintln!(
                "bench doctor: round {}/{rounds}, {}: the doctor, then a loader with its settings",
                round + 1,
                shape.name
            );
            let r = check(shape, &dir, step, phase)?;
            shape.rounds.push(r);
        }
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if args.json {
        let v = json!({
            "target_error_pct": TARGET_PCT,
            "rounds": rounds,
            "cores": cores,
            "step_ms": args.step_ms,
            "shapes": shapes.iter().map(shape_json).collect::<Vec<_>>(),
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?
        );
    } else {
        print!("{}", table(&shapes, cores, rounds, args));
    }
    Ok(())
}

fn make_shape(
    key: &str,
    args: &DoctorBenchArgs,
    dir: &Path,
    batch_size: usize,
    quick: bool,
) -> Result<Shape, String> {
    let workers = args.workers.clone();
    let image_sets = |batch: usize| -> Vec<(String, String)> {
        [
            ("transform", crate::demo::STANDARD_TRANSFORM.to_owned()),
            ("shuffle", "true".into()),
            ("batch_size", batch.to_string()),
            ("num_workers", workers.clone()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    };
    let folder = |images: usize, width: usize, height: usize, scale: (f64, f64)| {
        photos_or_drawn(
            dir,
            images,
            Size {
                width,
                height,
                scale,
            },
            args.data.synthetic,
        )
    };
    let shape = |key, name: String, note, path: PathBuf, source, images, sets, batch| Shape {
        key,
        name,
        note,
        source,
        path,
        images,
        sets,
        batch_size: batch,
        packed: Vec::new(),
        rounds: Vec::new(),
    };
    Ok(match key {
        "small" => {
            let n = args.images.unwrap_or(if quick { 480 } else { 1200 });
            // Thumbnails cut from large areas of the photographs: detailed, like web images.
            let (root, note) = folder(n, 160, 120, (0.15, 0.6))?;
            let source = format!("image_folder:{}", root.display());
            shape(
                "small",
                "JPEGs 160x120".into(),
                note,
                root,
                source,
                true,
                image_sets(batch_size),
                batch_size,
            )
        }
        "large" => {
            let n = args.images.unwrap_or(if quick { 96 } else { 240 });
            // Most of a photograph each: camera-sized images, barely resampled.
            let (root, note) = folder(n, 1600, 1200, (0.5, 1.0))?;
            let source = format!("image_folder:{}", root.display());
            shape(
                "large",
                "JPEGs 1600x1200".into(),
                note,
                root,
                source,
                true,
                image_sets(batch_size),
                batch_size,
            )
        }
        "parquet" => {
            let n = args.images.unwrap_or(if quick { 480 } else { 1280 });
            let rows = args
                .table_rows
                .unwrap_or(if quick { 9_600 } else { 32_000 });
            // The small shape's thumbnails, written as earlier releases of `datasets` wrote
            // them: images too small for packing to shrink, so that the read is what advice
            // can change.
            let (root, note) = folder(n, 160, 120, (0.15, 0.6))?;
            let table = parquet_table::table_in(&dir.join("parquet"), &root, rows)?;
            let source = format!("parquet:{}", table.display());
            let mut sets = image_sets(batch_size);
            sets.push((
                "parquet_cache".into(),
                cache_short_of(&source, rows)?.to_string(),
            ));
            shape(
                "parquet",
                "Parquet 160x120 (HF)".into(),
                note,
                table,
                source,
                true,
                sets,
                batch_size,
            )
        }
        "text" => {
            let rows = args.text_rows.unwrap_or(if quick { 2000 } else { 8000 });
            let (source, root, tokenizer) = parquet_text::text_in(&dir.join("text"), rows)?;
            let sets = [
                ("tokenizer", tokenizer.display().to_string()),
                ("eos_token", parquet_text::EOS_TOKEN.to_string()),
                ("seq_len", TEXT_SEQ_LEN.to_string()),
                ("shuffle", "true".into()),
                ("batch_size", TEXT_BATCH.to_string()),
                ("num_workers", workers),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
            shape(
                "text",
                "Parquet text, BPE".into(),
                None,
                root,
                source,
                false,
                sets,
                TEXT_BATCH,
            )
        }
        _ => {
            let n = args.npy_samples.unwrap_or(if quick { 1024 } else { 2048 });
            let path = super::npy::generated_npy_in(&dir.join("npy"), n)?;
            let batch = batch_size * NPY_BATCH_FACTOR;
            let sets = [
                ("shuffle", "true".to_owned()),
                ("batch_size", batch.to_string()),
                ("num_workers", workers),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
            let source = format!("npy:{}", path.display());
            shape(
                "npy",
                "npy uint8 [N,3,224,224]".into(),
                None,
                path,
                source,
                false,
                sets,
                batch,
            )
        }
    })
}

/// A `parquet_cache` for the table `source` of `rows` rows in row groups of 100: one and a half
/// `order=quasi_random`'s window of 32 row groups (decompressed), at most halfway from there to
/// the whole table, so that a window fits and a shuffle overflows it. Once warm, a shuffle hits a
/// cache holding a share of the table about that share of the time, which the doctor's first
/// samples do not see; the smaller the share, the more the table reads as one many times the
/// cache, as a real dataset is.
fn cache_short_of(source: &str, rows: usize) -> Result<u64, String> {
    let groups = rows.div_ceil(parquet_table::ROWS_PER_GROUP);
    if groups <= QUASI_RANDOM_WINDOW_PAGES {
        return Err(format!(
            "--table-rows {rows}: the table needs more than {QUASI_RANDOM_WINDOW_PAGES} row groups of {} rows, quasi_random's window",
            parquet_table::ROWS_PER_GROUP
        ));
    }
    let table = open_source(source)
        .map_err(|e| e.to_string())?
        .page_cache()
        .ok_or("a Parquet table reports its pages")?
        .pages;
    let window = table / groups as u64 * QUASI_RANDOM_WINDOW_PAGES as u64;
    Ok((window + window / 2).min(window + (table - window) / 2))
}

/// The doctor on `shape`'s settings, then a loader with the settings it predicts for; every
/// measurement runs for `phase`.
fn check(shape: &mut Shape, dir: &Path, step: Duration, phase: Duration) -> Result<Round, String> {
    let mut base = LoaderOptions::new();
    base.set("source", &shape.source)
        .map_err(|e| e.to_string())?;
    // Measurements by time, not samples: a shape's are then as long as each other, and long
    // enough for a shared machine's scheduler to settle.
    let config = Config {
        step,
        samples: usize::MAX,
        timeline: None,
        progress: false,
        phase_limit: phase,
        min_phase: Duration::ZERO,
        remote: false,
    };
    let report: Report = doctor::diagnose(&base, &shape.sets, &config)?;
    let (sets, pack_as) = model::advised(&shape.sets, &report.advice);
    let mut checked: Vec<String> = report.advice.iter().map(|a| a.set.clone()).collect();
    if let Some(p) = pack_as {
        let (packed, said) = match p {
            Pack::Samples { max_side } => (
                packed_copy(shape, dir, max_side)?,
                match max_side {
                    Some(side) => format!("source=packed (--max-side {side})"),
                    None => "source=packed".into(),
                },
            ),
            Pack::Tokens => (tokens_copy(shape, dir)?, "source=tokens (packed)".into()),
        };
        base.set("source", &packed).map_err(|e| e.to_string())?;
        if let Some(set) = checked.iter_mut().find(|s| s.starts_with("source=")) {
            *set = said;
        }
    }
    let options = measure::with(&base, &sets)?;
    let usage = Usage::start();
    let measured = measure::pipeline_run(&options, &config, None)?;
    Ok(Round {
        bottleneck: report.bottleneck,
        advice: report.advice.iter().map(|a| a.set.clone()).collect(),
        checked,
        doctor_samples_per_s: report.pipeline.samples_per_s,
        predicted: report.predicted_samples_per_s,
        model: report.advised_model_samples_per_s,
        measured: measured.samples_per_s,
        measured_cores: measured.cpu_cores,
        others_doctor: report.load.others_cores,
        others_check: usage.others_cores(),
        available: report.load.cores_for(report.cores as f64, report.cores),
    })
}

/// `shape`'s source packed as the advice says (`stoker pack SOURCE OUT [--max-side N]`), made
/// once; its `packed:` spec.
fn packed_copy(shape: &mut Shape, dir: &Path, max_side: Option<u32>) -> Result<String, String> {
    if let Some((_, spec)) = shape.packed.iter().find(|(s, _)| *s == max_side) {
        return Ok(spec.clone());
    }
    if !shape.images {
        return Err(format!(
            "the doctor advised packing {}, which holds no images",
            shape.name
        ));
    }
    let name = shape
        .path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| shape.key.to_owned());
    let out = dir.join("packed").join(match max_side {
        Some(side) => format!("{name}-max{side}.stkpack"),
        None => format!("{name}.stkpack"),
    });
    // `pack` writes under a temporary name and renames: a file there is whole.
    if !out.exists() {
        std::fs::create_dir_all(dir.join("packed"))
            .map_err(|e| format!("{}: {e}", dir.join("packed").display()))?;
        eprintln!(
            "bench doctor: packing {} as advised into {}",
            shape.name,
            out.display()
        );
        let source = open_source(&shape.source).map_err(|e| e.to_string())?;
        let options = PackOptions {
            max_side,
            ..PackOptions::default()
        };
        pack(&*source, &out, &options, &|_, _| {}).map_err(|e| e.to_string())?;
    }
    let spec = format!("packed:{}", out.display());
    shape.packed.push((max_side, spec.clone()));
    Ok(spec)
}

/// `shape`'s text tokenized once as the advice says (`stoker pack SOURCE OUT.npy` with its
/// text's options), made once; its `tokens:` spec.
fn tokens_copy(shape: &Shape, dir: &Path) -> Result<String, String> {
    let text_sets = text_sets(&shape.sets);
    if text_sets.is_empty() {
        return Err(format!(
            "the doctor advised tokenizing {} once, which is not text",
            shape.name
        ));
    }
    let out = dir.join("packed").join(format!("{}-tokens.npy", shape.key));
    // `write_flat` writes under temporary names and renames: a file there is whole (and its
    // sidecar, renamed first, too).
    if !out.exists() {
        std::fs::create_dir_all(dir.join("packed"))
            .map_err(|e| format!("{}: {e}", dir.join("packed").display()))?;
        eprintln!(
            "bench doctor: tokenizing {} once as advised into {}",
            shape.name,
            out.display()
        );
        open_tokens(&shape.source, &text_sets)?
            .write_flat(&out, &mut |_| {})
            .map_err(|e| e.to_string())?;
    }
    Ok(format!("tokens:{}", out.display()))
}

/// A shape's result over the rounds.
struct Summary<'a> {
    checked: &'a [String],
    /// The rounds that checked those settings.
    rounds: Vec<&'a Round>,
    /// The round with the best prediction, and the one with the best check.
    predicting: &'a Round,
    checking: &'a Round,
    given: f64,
}

impl Summary<'_> {
    fn error_pct(&self) -> f64 {
        (self.predicting.predicted - self.checking.measured) / self.checking.measured.max(1e-9)
            * 100.0
    }
}

/// The settings checked most often (ties: the one with the fastest check), and the best
/// prediction and check among those rounds.
fn summary(shape: &Shape) -> Option<Summary<'_>> {
    let mut groups: Vec<(&[String], Vec<&Round>)> = Vec::new();
    for r in &shape.rounds {
        match groups.iter_mut().find(|(c, _)| *c == r.checked.as_slice()) {
            Some((_, rounds)) => rounds.push(r),
            None => groups.push((&r.checked, vec![r])),
        }
    }
    let fastest = |rounds: &[&Round]| rounds.iter().map(|r| r.measured).fold(0.0, f64::max);
    let (checked, rounds) = groups.into_iter().max_by(|a, b| {
        a.1.len()
            .cmp(&b.1.len())
            .then(fastest(&a.1).total_cmp(&fastest(&b.1)))
    })?;
    let predicting = *rounds
        .iter()
        .max_by(|a, b| a.predicted.total_cmp(&b.predicted))?;
    let checking = *rounds
        .iter()
        .max_by(|a, b| a.measured.total_cmp(&b.measured))?;
    let given = rounds
        .iter()
        .map(|r| r.doctor_samples_per_s)
        .fold(0.0, f64::max);
    Some(Summary {
        checked,
        rounds,
        predicting,
        checking,
        given,
    })
}

fn verdict(error_pct: f64) -> &'static str {
    if error_pct.abs() <= TARGET_PCT {
        "pass"
    } else {
        "FAIL"
    }
}

fn given(shape: &Shape) -> String {
    shape
        .sets
        .iter()
        .filter(|(k, _)| k != "transform")
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn table(shapes: &[Shape], cores: usize, rounds: usize, args: &DoctorBenchArgs) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "stoker doctor's prediction against a loader run with the settings predicted for \
         (target: within {TARGET_PCT:.0}%)"
    );
    let _ = writeln!(
        out,
        "{cores} cores, step {} ms; {rounds} round{} of the doctor then its check; best \
         prediction and best check compared",
        args.step_ms,
        if rounds == 1 { "" } else { "s" }
    );
    let _ = writeln!(
        out,
        "\n{:<24} {:<10} {:>10} {:>10} {:>10} {:>10} {:>8} {:>7}  verdict",
        "data", "bottleneck", "given", "predicted", "measured", "model", "error", "gain"
    );
    for shape in shapes {
        let Some(s) = summary(shape) else { continue };
        let _ = writeln!(
            out,
            "{:<24} {:<10} {:>10} {:>10} {:>10} {:>10} {:>+7.1}% {:>6.2}x  {}",
            shape.name,
            s.predicting.bottleneck,
            fmt_rate(s.given),
            fmt_rate(s.predicting.predicted),
            fmt_rate(s.checking.measured),
            fmt_rate(s.predicting.model),
            s.error_pct(),
            s.checking.measured / s.given.max(1e-9),
            verdict(s.error_pct())
        );
    }
    let _ = writeln!(
        out,
        "\n  samples/s. given: the doctor's pipeline run of the given settings; predicted: the \
         doctor's figure for\n  the checked settings; measured: a loader with them, measured as \
         the doctor measures; model: the\n  doctor's model alone (the stage costs on the cores \
         other work left); error: predicted vs measured;\n  gain: measured / given."
    );
    for shape in shapes {
        let Some(s) = summary(shape) else { continue };
        let _ = writeln!(out, "\n  {}: {}", shape.name, shape.source);
        if let Some(note) = &shape.note {
            let _ = writeln!(out, "    data     {note}");
        }
        let _ = writeln!(out, "    given    {}", given(shape));
        if s.checked.is_empty() {
            let _ = writeln!(out, "    checked  the given settings (no advice)");
        } else {
            let _ = writeln!(out, "    checked  {}", s.checked.join(", "));
        }
        let _ = writeln!(
            out,
            "    cpu      the doctor found {:.1} cores for this process, other work using {:.1}; \
             the check used {:.1}, other work {:.1}",
            s.predicting.available,
            s.predicting.others_doctor,
            s.checking.measured_cores,
            s.checking.others_check
        );
        if shape.rounds.len() > 1 {
            for (i, r) in shape.rounds.iter().enumerate() {
                let checked = if r.checked.is_empty() {
                    "no advice".to_owned()
                } else {
                    r.checked.join(", ")
                };
                let _ = writeln!(
                    out,
                    "    round {}  {:>9} {:>9} {:>+7.1}%  {}: {checked}{}",
                    i + 1,
                    fmt_rate(r.predicted),
                    fmt_rate(r.measured),
                    r.error_pct(),
                    r.bottleneck,
                    if s.rounds.iter().any(|x| std::ptr::eq(*x, r)) {
                        ""
                    } else {
                        " (not compared)"
                    }
                );
            }
        }
    }
    out
}

/// A rate for JSON, rounded to a hundredth.
fn num(x: f64) -> Value {
    if x.is_finite() {
        json!((x * 100.0).round() / 100.0)
    } else {
        Value::Null
    }
}

fn shape_json(shape: &Shape) -> Value {
    let round = |r: &Round| {
        json!({
            "bottleneck": r.bottleneck,
            "advice": r.advice,
            "checked": r.checked,
            "doctor_samples_per_s": num(r.doctor_samples_per_s),
            "predicted_samples_per_s": num(r.predicted),
            "model_samples_per_s": num(r.model),
            "measured_samples_per_s": num(r.measured),
            "measured_cpu_cores": num(r.measured_cores),
            "others_cores_doctor": num(r.others_doctor),
            "others_cores_check": num(r.others_check),
            "cores_available_doctor": num(r.available),
            "error_pct": num(r.error_pct()),
        })
    };
    let mut v = json!({
        "shape": shape.key,
        "name": shape.name,
        "source": shape.source,
        "batch_size": shape.batch_size,
        "given": shape.sets.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
        "data_note": shape.note,
        "rounds": shape.rounds.iter().map(round).collect::<Vec<_>>(),
    });
    if let (Some(s), Some(map)) = (summary(shape), v.as_object_mut()) {
        for (k, x) in [
            ("bottleneck", json!(s.predicting.bottleneck)),
            ("checked", json!(s.checked)),
            ("given_samples_per_s", num(s.given)),
            ("predicted_samples_per_s", num(s.predicting.predicted)),
            ("model_samples_per_s", num(s.predicting.model)),
            ("measured_samples_per_s", num(s.checking.measured)),
            ("error_pct", num(s.error_pct())),
            ("pass", json!(s.error_pct().abs() <= TARGET_PCT)),
        ] {
            map.insert(k.to_owned(), x);
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(checked: &[&str], predicted: f64, measured: f64) -> Round {
        Round {
            bottleneck: "workers",
            advice: checked.iter().map(|s| s.to_string()).collect(),
            checked: checked.iter().map(|s| s.to_string()).collect(),
            doctor_samples_per_s: predicted / 2.0,
            predicted,
            model: predicted,
            measured,
            measured_cores: 1.0,
            others_doctor: 0.0,
            others_check: 0.0,
            available: 2.0,
        }
    }

    fn shape(rounds: Vec<Round>) -> Shape {
        Shape {
            key: "small",
            name: "JPEGs".into(),
            note: None,
            path: PathBuf::from("x"),
            source: "image_folder:x".into(),
            images: true,
            sets: Vec::new(),
            batch_size: 4,
            packed: Vec::new(),
            rounds,
        }
    }

    #[test]
    fn the_settings_checked_most_often_are_summarised_by_their_best_rounds() {
        let s = shape(vec![
            round(&["num_workers=2"], 100.0, 80.0),
            round(&["num_workers=2", "dtype=uint8"], 300.0, 290.0),
            round(&["num_workers=2"], 90.0, 95.0),
        ]);
        let sum = summary(&s).unwrap();
        assert_eq!(sum.checked, ["num_workers=2".to_owned()]);
        assert_eq!(sum.rounds.len(), 2);
        assert_eq!(
            (sum.predicting.predicted, sum.checking.measured),
            (100.0, 95.0)
        );
        assert_eq!(sum.given, 50.0);
        assert!((sum.error_pct() - 5.0 / 95.0 * 100.0).abs() < 1e-9);
        assert_eq!(verdict(sum.error_pct()), "pass");
        assert_eq!(verdict(-15.1), "FAIL");
        assert!(summary(&shape(Vec::new())).is_none());
    }

    #[test]
    fn the_parquet_cache_holds_a_window_and_not_the_table() {
        let dir = std::env::temp_dir().join(format!("stoker-doctor-cache-{}", std::process::id()));
        let root = crate::photos::synthetic(&dir, "drawn", 2, 16, 12).unwrap();
        let rows = 3_400;
        let table = parquet_table::table_in(&dir, &root, rows).unwrap();
        let source = format!("parquet:{}", table.display());
        let cache = cache_short_of(&source, rows).unwrap();
        let pages = open_source(&source).unwrap().page_cache().unwrap().pages;
        // 34 row groups: a window of 32 is 32/34 of the table; the cache is halfway from there
        // to the table (one and a half windows would be more than the table).
        let window = pages / 34 * 32;
        assert_eq!(cache, window + (pages - window) / 2);
        assert!(window < cache && cache < pages, "{window} {cache} {pages}");
        // A table of 32 row groups or fewer is a single window.
        let e = cache_short_of(&source, 3_200).unwrap_err();
        assert!(
            e.contains("--table-rows 3200") && e.contains("32 row groups"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
