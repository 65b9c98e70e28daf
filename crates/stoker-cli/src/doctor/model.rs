//! The model of the pipeline: each limit on its throughput (`Limits`), the one that binds (the
//! bottleneck), the advice that lifts it and the throughput predicted with it (`analyse`), and
//! the settings an advice asks for (`advised`).

use std::time::Duration;

use stoker_core::memory::human;
use stoker_core::source::PageCacheFit;

use super::machine::Load;
use super::measure::{without_text_sets, Costs, PackedCosts, Pipeline};

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
    /// The source packed once with `stoker pack` and read from what it wrote.
    Pack(Pack),
}

/// How to pack the source.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Pack {
    /// `stoker pack SOURCE OUT [--max-side N]`, read as `packed:OUT`; `max_side`: images shrunk
    /// to at most this many pixels on a side.
    Samples { max_side: Option<u32> },
    /// A text source tokenized once, `stoker pack SOURCE OUT.npy` with its
    /// [`TEXT_OPTIONS`](super::measure::TEXT_OPTIONS), read as `tokens:OUT.npy` without them.
    Tokens,
}

/// A stage's cost on one core.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StageCost {
    pub(crate) name: &'static str,
    pub(crate) us_per_sample: f64,
}

/// What the doctor found: the measurements, the bottleneck, the advice and the throughputs
/// the model predicts.
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
    /// Where the advice reads another source the model does not predict (text tokenized
    /// once): what `predicted_samples_per_s` was measured on instead, a pipeline with the
    /// advised settings.
    pub(crate) prediction_measured_on: Option<String>,
    pub(crate) advice: Vec<Advice>,
    pub(crate) step: Duration,
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
            Change::Pack(p) => {
                if *p == Pack::Tokens {
                    out = without_text_sets(&out);
                }
                pack = Some(*p);
            }
        }
    }
    (out, pack)
}

/// The same settings with uint8 output: normalize left to the GPU.
pub(super) fn uint8_sets(sets: &[(String, String)]) -> Vec<(String, String)> {
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
pub(super) fn packing_helps(costs: &Costs, mean_size: Option<(f64, f64)>) -> bool {
    let decode_heaviest = [
        costs.read_us - costs.io_wait_us,
        costs.transform_us,
        costs.collate_us,
    ]
    .iter()
    .all(|&c| costs.decode_us >= c);
    decode_heaviest && mean_size.is_some_and(|(w, h)| w.max(h) > PACK_SIDE * 1.2)
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
    /// Whether a CUDA device is present and could decode the JPEGs with this transform (GPU
    /// decoding: crops, resizes and flips only).
    pub(crate) gpu_decode: bool,
    /// Remote shards: whether `cache_dir` is set, and `shard_prefetch` as set.
    pub(crate) remote_cache: bool,
    pub(crate) shard_prefetch: Option<usize>,
    /// A shuffled source over more decompressed pages than it keeps: how far over, and the
    /// stages' costs in `order=quasi_random`.
    pub(crate) quasi_random: Option<(PageCacheFit, Costs)>,
    /// A text source: reading it tokenized once, as measured.
    pub(crate) tokenized_once: Option<TokenizedOnce>,
}

/// A text source's first documents tokenized once (`stoker pack SOURCE OUT.npy`) and read as a
/// `tokens:` file.
#[derive(Clone, Debug)]
pub(crate) struct TokenizedOnce {
    /// The stages' costs reading them.
    pub(crate) costs: Costs,
    /// How many documents were written.
    pub(crate) documents: u64,
    /// The options the text was tokenized with ([`TEXT_OPTIONS`](super::measure::TEXT_OPTIONS)
    /// as set), which `stoker pack` takes and the `tokens:` source does not.
    pub(crate) text_sets: Vec<(String, String)>,
}

/// Reading another way (`order=quasi_random`, text tokenized once) is advised when it cuts the
/// read stage's cost to less than this share of its cost now...
const READS_AT_MOST: f64 = 0.7;
/// ...by at least this share of a sample's whole time: the shuffle's reach is narrowed, or a
/// file written, only where that pays.
const SAVES_AT_LEAST: f64 = 0.1;

/// Whether reading at `read_us` instead of as measured in `costs` is worth advising.
fn reading_pays(costs: &Costs, read_us: f64) -> bool {
    read_us < READS_AT_MOST * costs.read_us
        && costs.read_us - read_us >= SAVES_AT_LEAST * costs.wall_us()
}

/// Remote shard downloads in flight that hid 50 ms per request behind decoding in the
/// benchmark (`bench/remote_shards.sh --shards 64`: a cold epoch 1 at 0.51x of local tar with
/// 2, 0.74x with 8, 0.90x with 16; streaming from a `wids` index 0.81-0.88x with 2, 0.92x
/// with 16).
const ADVISED_SHARD_PREFETCH: usize = 16;

/// Where the cache advice suggests putting the cache: a path the user replaces.
const CACHE_DIR_EXAMPLE: &str = "/local/disk/stoker-cache";

/// The side packing would store images at.
pub(super) const PACK_SIDE: f64 = 256.0;
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

/// The bottleneck, the advice and the throughputs predicted, from what was measured.
pub(super) fn analyse(
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
                        "the loader keeps up (readiness {:.0}%): the training step is the bottleneck; {} suffice and leave {} to the trainer",
                        pipeline.readiness * 100.0,
                        counted(enough, "worker"),
                        counted(w - enough, "core")
                    ),
                    change: Change::Set("num_workers", enough.to_string()),
                });
                workers = enough;
            }
        }
        // Reading binds by waiting (not by its CPU work, which more workers cannot add cores
        // to): threads waiting on I/O use no core, so more of them overlap more waits.
        "io" if io_share > 0.5 => {
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
                    change: Change::Pack(Pack::Samples { max_side: None }),
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
                    change: Change::Pack(Pack::Samples {
                        max_side: Some(PACK_SIDE as u32),
                    }),
                });
            }
        }
    }
    // Decoding binds and a GPU could take some of it: the share that brings the cores' rate to
    // the consumer's (all it can take without a step to aim for).
    if alt.gpu_decode
        && (bottleneck == "decode" || (bottleneck == "workers" && heaviest == "decode"))
    {
        let cores_now = Limits::of(&after, workers, machine, pipeline.h2d_us, consumer);
        let needed_cpu_us = if consumer.is_finite() {
            after.cpu_us() * cores_now.workers.min(cores_now.cores) / consumer
        } else {
            0.0
        };
        let share = ((after.cpu_us() - needed_cpu_us) / after.decode_us.max(1e-9)).clamp(0.1, 1.0);
        let share = (share * 10.0).ceil() / 10.0;
        if needed_cpu_us < after.cpu_us() {
            advice.push(Advice {
                set: format!("gpu_decode_share={share}"),
                why: format!(
                    "decode is {:.0}% of a sample's CPU time and a GPU is present: with device=cuda the GPU's JPEG decoder (nvJPEG) decodes, crops and resizes {:.0}% of the samples, chosen by index, and the cores the rest (its own rate is not measured here: see `stoker bench` on the GPU machine)",
                    after.decode_us / after.cpu_us().max(1e-9) * 100.0,
                    share * 100.0
                ),
                change: Change::Set("gpu_decode_share", share.to_string()),
            });
            after.decode_us *= 1.0 - share;
        }
    }
    // Shuffled over more decompressed pages than it keeps, a row mostly decompresses its page
    // again; in quasi_random's order a window of pages stays in the cache. (Packing replaces the
    // source, and with it this cost.)
    if let Some((fit, q)) = &alt.quasi_random {
        let saved = costs.read_us - q.read_us;
        if packed.is_none() && bottleneck != "consumer" && reading_pays(&costs, q.read_us) {
            after.read_us = (after.read_us - saved).max(after.io_wait_us);
            advice.push(Advice {
                set: "order=quasi_random".into(),
                why: format!(
                    "the table's pages are {} decompressed and the loader keeps {} of them (`parquet_cache`): shuffled, most rows decompress their page again, and reading costs {:.0} us a sample; `order=quasi_random` shuffles within windows of 32 pages, which the cache holds: {:.0} us a sample, measured on the first {} samples of an epoch in that order (or `parquet_cache` above {}, memory permitting)",
                    human(fit.pages),
                    human(fit.kept),
                    costs.read_us,
                    q.read_us,
                    q.samples,
                    human(fit.pages)
                ),
                change: Change::Set("order", "quasi_random".into()),
            });
        }
    }
    // Text tokenized in the workers, every epoch: `stoker pack` tokenizes it once.
    if let Some(t) = &alt.tokenized_once {
        if bottleneck != "consumer" && reading_pays(&costs, t.costs.read_us) {
            after.read_us = t.costs.read_us;
            after.io_wait_us = t.costs.io_wait_us;
            let text_sets: String = t
                .text_sets
                .iter()
                .map(|(k, v)| format!(" --set {k}={v}"))
                .collect();
            let keys: Vec<&str> = t.text_sets.iter().map(|(k, _)| k.as_str()).collect();
            let keys = match keys.split_last() {
                Some((last, [])) => (*last).to_owned(),
                Some((last, others)) => format!("{} and {last}", others.join(", ")),
                None => String::new(),
            };
            advice.push(Advice {
                set: "source=tokens:OUT.npy".into(),
                why: format!(
                    "the text is tokenized as it is read, every epoch: {:.0} us a sample; `stoker pack SOURCE OUT.npy{text_sets}` tokenizes it once, on every core, into a token file and its documents, and `source=tokens:OUT.npy` (without {keys}) reads the same samples: {:.0} us a sample, measured on the first {} documents so written",
                    costs.read_us,
                    t.costs.read_us,
                    t.documents
                ),
                change: Change::Pack(Pack::Tokens),
            });
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
        prediction_measured_on: None,
        advice,
        step,
    }
}

/// `1 worker`, `3 workers`.
fn counted(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sets(kv: &[(&str, &str)]) -> Vec<(String, String)> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// `costs` analysed on 16 idle cores with a worker on each, every worker busy, delivering
    /// 16,000 samples/s in batches of 256, the consumer finding one ready `readiness` of the
    /// time and taking one every `step`; `alt` the alternatives measured.
    fn on_16_cores(costs: Costs, readiness: f64, step: Duration, alt: &Alternatives) -> Report {
        let pipeline = Pipeline {
            samples_per_s: 16_000.0,
            readiness,
            workers: 16,
            worker_busy: 1.0,
            h2d_us: None,
            batch_size: 256,
            cpu_cores: 16.0,
        };
        let machine = Machine {
            cores: 16,
            load: super::super::machine::Load::IDLE,
            copy_parallelism: f64::INFINITY,
        };
        analyse(costs, pipeline, machine, step, alt)
    }

    /// Images of 200x200 pixels, and nothing else measured.
    fn small_images() -> Alternatives {
        Alternatives {
            mean_size: Some((200.0, 200.0)),
            uint8_transform_us: None,
            packed: None,
            remote: false,
            gpu_decode: false,
            remote_cache: false,
            shard_prefetch: None,
            quasi_random: None,
            tokenized_once: None,
        }
    }

    /// A decode-bound pipeline on 16 cores, every one with a worker: 800 us of 1000 us decoding.
    fn decode_bound(gpu_decode: bool, step: Duration) -> Report {
        let costs = Costs {
            read_us: 50.0,
            io_wait_us: 0.0,
            decode_us: 800.0,
            transform_us: 120.0,
            collate_us: 30.0,
            samples: 1000,
            bytes_per_sample: 150_528.0,
        };
        let alt = Alternatives {
            gpu_decode,
            ..small_images()
        };
        on_16_cores(costs, 0.5, step, &alt)
    }

    #[test]
    fn decode_bound_with_a_gpu_advises_the_share_that_meets_the_step() {
        // A step of 256 samples every 10 ms is 25,600 samples/s; the cores give 16,000.
        let report = decode_bound(true, Duration::from_millis(10));
        assert_eq!(report.bottleneck, "decode");
        let gpu = report
            .advice
            .iter()
            .find(|a| a.set.starts_with("gpu_decode_share="))
            .expect("GPU decoding is advised");
        // 1000 us a sample must become 625: 375 us of the 800 of decoding, a share of 0.47,
        // rounded up to a tenth.
        assert_eq!(gpu.set, "gpu_decode_share=0.5");
        assert!(gpu.why.contains("nvJPEG"), "{}", gpu.why);
        assert!(report.predicted_samples_per_s > 16_000.0 * 1.5);
        // Without a step to aim for the device takes all it can; without a GPU nothing.
        let all = decode_bound(true, Duration::ZERO);
        assert!(all.advice.iter().any(|a| a.set == "gpu_decode_share=1"));
        let none = decode_bound(false, Duration::from_millis(10));
        assert!(!none
            .advice
            .iter()
            .any(|a| a.set.starts_with("gpu_decode_share")));
    }

    /// A shuffled table larger than its page cache on 16 cores: reading (decompressing the
    /// row's page) is 700 of a sample's 1,000 us, and `quasi` us in quasi_random's order; the
    /// consumer takes a batch every `step` and finds one ready `readiness` of the time.
    fn table_larger_than_its_cache(quasi: Option<f64>, step: Duration, readiness: f64) -> Report {
        let costs = Costs {
            read_us: 700.0,
            io_wait_us: 0.0,
            decode_us: 250.0,
            transform_us: 40.0,
            collate_us: 10.0,
            samples: 512,
            bytes_per_sample: 150_528.0,
        };
        let fit = PageCacheFit {
            pages: 150 << 30,
            kept: 1 << 30,
        };
        let alt = Alternatives {
            quasi_random: quasi.map(|read_us| (fit, Costs { read_us, ..costs })),
            ..small_images()
        };
        on_16_cores(costs, readiness, step, &alt)
    }

    #[test]
    fn a_shuffled_table_larger_than_its_cache_is_advised_quasi_random_where_it_pays() {
        let report = table_larger_than_its_cache(Some(80.0), Duration::ZERO, 0.5);
        assert_eq!(report.bottleneck, "io");
        let q = report
            .advice
            .iter()
            .find(|a| a.set == "order=quasi_random")
            .expect("quasi_random advised");
        for words in ["150.0 GiB", "1.0 GiB", "700 us", "80 us", "parquet_cache"] {
            assert!(q.why.contains(words), "{words}: {}", q.why);
        }
        // 1,000 us a sample becomes 380: the cores' rate rises by as much.
        let gain = report.advised_model_samples_per_s / report.model_samples_per_s;
        assert!((gain - 1000.0 / 380.0).abs() < 0.01, "{gain}");
        // Not when quasi_random saves little, nor when it was not measured, nor when the
        // loader keeps up with the step.
        for report in [
            table_larger_than_its_cache(Some(600.0), Duration::ZERO, 0.5),
            table_larger_than_its_cache(None, Duration::ZERO, 0.5),
            table_larger_than_its_cache(Some(80.0), Duration::from_secs(1), 1.0),
        ] {
            assert!(!report.advice.iter().any(|a| a.set.starts_with("order=")));
        }
    }

    /// Text on 16 cores, tokenized as it is read: 2,000 us a sample; `once` us read from the
    /// tokens file.
    fn text(once: Option<f64>, step: Duration, readiness: f64) -> Report {
        let costs = Costs {
            read_us: 2000.0,
            collate_us: 2.0,
            samples: 512,
            bytes_per_sample: 16_384.0,
            ..Costs::default()
        };
        let alt = Alternatives {
            tokenized_once: once.map(|read_us| TokenizedOnce {
                costs: Costs { read_us, ..costs },
                documents: 100,
                text_sets: sets(&[("tokenizer", "/m/tokenizer.json"), ("eos_token", "2")]),
            }),
            ..Alternatives::default()
        };
        on_16_cores(costs, readiness, step, &alt)
    }

    #[test]
    fn text_tokenized_as_it_is_read_is_advised_tokenized_once_where_it_pays() {
        let report = text(Some(8.0), Duration::ZERO, 0.0);
        let a = report
            .advice
            .iter()
            .find(|a| a.change == Change::Pack(Pack::Tokens))
            .expect("tokenizing once advised");
        for words in [
            "2000 us",
            "8 us",
            "first 100 documents",
            "`stoker pack SOURCE OUT.npy --set tokenizer=/m/tokenizer.json --set eos_token=2`",
            "`source=tokens:OUT.npy` (without tokenizer and eos_token) reads",
        ] {
            assert!(a.why.contains(words), "{words}: {}", a.why);
        }
        // Not when tokenizing once saves little, nor when it was not measured (not text), nor
        // when the loader keeps up with the step.
        for report in [
            text(Some(1900.0), Duration::ZERO, 0.0),
            text(None, Duration::ZERO, 0.0),
            text(Some(8.0), Duration::from_secs(1), 1.0),
        ] {
            assert!(!report.advice.iter().any(|a| a.set.starts_with("source=")));
        }
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
}
