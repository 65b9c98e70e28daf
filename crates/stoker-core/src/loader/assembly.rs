//! What both schedulers are made of, resolved and built in one place.
//!
//! The host scheduler (`host`) and the streaming one (`stream`) differ in their schedule only:
//! batches dealt from the sampler and delivered in its order, or cut from a stream by a feeder.
//! Everything else is the same for both and comes from here, from the [`LoaderOptions`]:
//!
//! - [`Resolved::new`], before the source is opened: the launch (rank, world size), the worker
//!   count (`num_workers=auto` is this rank's share of the cores; under autotune it starts at
//!   one), where batch memory is pinned or registered, whether image fields are cast on the
//!   device (`gpu_normalize`: on with a device unless false; `true` without one is refused),
//!   the consumer's timeout, and the options refused together (`autotune` or `timeout_ms` with
//!   `num_workers=0`);
//! - [`Resolved::assemble`], once the fields are known: the image stages and the [`Collator`],
//!   the [`Arena`], the [`StatsRecorder`] and its trace, the `memory_budget` plan that lowers
//!   the in-flight cap (or refuses a batch that cannot fit), the autotune [`Controller`], and
//!   the threads that build batches: the worker [`Pool`], or the calling thread's context with
//!   `num_workers=0`.
//!
//! [`Cap`] is the in-flight cap both then keep, and the one rule that moves it (autotune's
//! decisions); each scheduler applies the depth it allows in its own way (tasks submitted, or
//! a stream's tokens).

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::arena::{Arena, SlabRegistrar};
use crate::autotune::{Controller, Observation};
use crate::collate::{Collator, DecodeShare};
use crate::decode::JpegDecoder;
use crate::error::{Error, Result};
use crate::launch::Launch;
use crate::memory::BudgetPlan;
use crate::options::{LoaderOptions, OnError};
use crate::pool::{Builder, Pool, WorkerCtx};
use crate::source::{FieldSpec, Source};
use crate::stats::{StatsHandle, StatsRecorder};
use crate::trace::{Trace, Track};

use super::depth::Depth;

/// How a scheduler's batches are used.
pub(super) enum Mode {
    /// Batches go straight to the consumer.
    Host,
    /// Batches go to the prefetch thread; slabs are registered with the device (`pin_memory`).
    Feed {
        registrar: Option<Arc<dyn SlabRegistrar>>,
        /// Whether the device can decode JPEGs (its decoder loaded), or why not.
        jpeg: std::result::Result<(), String>,
    },
}

/// What the options say before any source is opened.
pub(super) struct Resolved {
    pub(super) launch: Launch,
    /// Worker threads to start; 0: batches are built in the calling thread.
    pub(super) workers: usize,
    /// The cores this rank may use (autotune's ceiling on workers).
    cores: usize,
    /// Whether batches go to a prefetch thread (whose consumer counts deliveries and applies
    /// the timeout).
    pub(super) feed: bool,
    pin: bool,
    registrar: Option<Arc<dyn SlabRegistrar>>,
    /// Whether image fields are cast on the device (`gpu_normalize`), and whether that was
    /// insisted on (`Some(true)`: a field that cannot be is an error).
    cast_on_device: Option<bool>,
    /// GPU decoding: the share the device decodes, and whether `jpeg_decoder=gpu` insists.
    gpu_decode: Option<(f64, bool)>,
    /// The consumer's wait for a batch, when this side of the prefetch thread applies it.
    pub(super) timeout: Option<Duration>,
}

/// GPU decoding as the options ask for it, whatever the device: the share the device decodes
/// and whether that is insisted on (`jpeg_decoder=gpu`, or a share given); `None` when the
/// workers decode every image. A share with a CPU decoder named is an error.
pub(super) fn gpu_decode_asked(options: &LoaderOptions) -> Result<Option<(f64, bool)>> {
    Ok(match (options.jpeg_decoder, options.gpu_decode_share) {
        (Some(JpegDecoder::Gpu), share) => Some((share.unwrap_or(1.0), true)),
        (None | Some(JpegDecoder::Auto), Some(share)) => Some((share, share > 0.0)),
        // `auto` starts at none, for autotune to move; without it nothing would.
        (None | Some(JpegDecoder::Auto), None) => options.autotune.then_some((0.0, false)),
        (Some(_), Some(share)) if share > 0.0 => {
            return Err(Error::option(
                "gpu_decode_share",
                "the device decodes JPEGs only with jpeg_decoder=gpu or auto",
            ))
        }
        (Some(_), _) => None,
    })
}

/// GPU decoding as the options ask for it and the loader allows: [`gpu_decode_asked`], when the
/// loader has a device that can decode. Insisted on without a device, or with a device that
/// cannot decode, it is an error saying why; `auto` quietly leaves it to the workers.
fn gpu_decode(options: &LoaderOptions, mode: &Mode) -> Result<Option<(f64, bool)>> {
    let Some((share, required)) = gpu_decode_asked(options)? else {
        return Ok(None);
    };
    let jpeg = match mode {
        Mode::Feed { jpeg, .. } => jpeg,
        Mode::Host if required => {
            let key = if options.jpeg_decoder == Some(JpegDecoder::Gpu) {
                "jpeg_decoder"
            } else {
                "gpu_decode_share"
            };
            return Err(Error::option(
                key,
                "decoding on the device needs device=cuda",
            ));
        }
        Mode::Host => return Ok(None),
    };
    match jpeg {
        Ok(()) => Ok(Some((share, required))),
        Err(why) if required => Err(Error::option(
            "jpeg_decoder",
            format!("the device cannot decode JPEGs: {why}"),
        )),
        Err(_) => Ok(None),
    }
}

/// What the collator is made for.
pub(super) enum Samples<'a> {
    /// Indices of a map-style source.
    Indexed(&'a Arc<dyn Source>),
    /// Owned samples of a stream with these fields.
    Streamed(&'a [FieldSpec]),
}

/// Everything both schedulers share, built.
pub(super) struct Assembly {
    /// The collator, arena and stats every builder of batches uses.
    pub(super) builder: Arc<Builder>,
    pub(super) stats: Arc<StatsRecorder>,
    /// The worker threads (`None` with `num_workers=0`).
    pub(super) pool: Option<Pool>,
    /// The calling thread's context when it builds batches (`num_workers=0`).
    pub(super) local: Option<WorkerCtx>,
    pub(super) cap: Cap,
    /// The most batches ever in flight: the cap, or under autotune its ceiling. The pool's
    /// queues (and a stream's tokens) are bounded by it.
    pub(super) capacity: usize,
    /// The depth, starting at the workers + 1.
    pub(super) depth: Depth,
}

impl Resolved {
    /// `launch` is resolved once per loader, by its caller.
    pub(super) fn new(options: &LoaderOptions, launch: Launch, mode: Mode) -> Result<Resolved> {
        let feed = matches!(mode, Mode::Feed { .. });
        let gpu_decode = gpu_decode(options, &mode)?;
        if !feed && options.num_workers == Some(0) && options.timeout_ms > 0 {
            // Refused rather than ignored: the caller asked for a bound that cannot hold.
            return Err(Error::option(
                "timeout_ms",
                format!(
                    "timeout_ms={} needs num_workers >= 1: with num_workers=0 each batch is \
                     built on the calling thread, which a timeout cannot interrupt",
                    options.timeout_ms
                ),
            ));
        }
        // Under autotune, `num_workers=auto` starts from one worker and the controller adds
        // more, up to this rank's share of the cores; a number is where it starts.
        let cores = (crate::launch::usable_cores() / launch.local_world_size.max(1)).max(1);
        let workers =
            match (options.autotune, options.num_workers) {
                (true, Some(0)) => return Err(Error::option(
                    "autotune",
                    "needs worker threads, but num_workers=0 builds batches in the calling thread",
                )),
                (true, None) => 1,
                _ => options.workers_for(&launch),
            };
        // For a device, `pin_memory` means registration with its driver (which page-locks the
        // slab itself), not mlock.
        let (pin, registrar) = match mode {
            Mode::Host => {
                let pin = options.pin_memory.unwrap_or(false);
                (pin, pin.then(crate::cuda::host_registrar).flatten())
            }
            Mode::Feed { registrar, .. } => (false, registrar),
        };
        let cast_on_device = match (feed, options.gpu_normalize) {
            (_, Some(false)) => None,
            (true, insisted) => Some(insisted.is_some()),
            (false, None) => None,
            (false, Some(true)) => {
                return Err(Error::option(
                    "gpu_normalize",
                    "true needs device=cuda: host batches are converted on the CPU",
                ))
            }
        };
        Ok(Resolved {
            launch,
            workers,
            cores,
            feed,
            pin,
            registrar,
            cast_on_device,
            gpu_decode,
            // Fed to a prefetch thread, the consumer's timeout applies on the consumer's side.
            timeout: (options.timeout_ms > 0 && !feed)
                .then(|| Duration::from_millis(options.timeout_ms)),
        })
    }

    /// Builds what both schedulers share for `samples`. `per_rank`: samples this rank takes
    /// per epoch, when known (the largest batch is at most that); `skipped`: samples passed
    /// over when the source was opened (damaged shard tails); `workers_held_back`: see
    /// [`Builder::workers_held_back`].
    pub(super) fn assemble(
        &self,
        options: &LoaderOptions,
        samples: Samples<'_>,
        per_rank: Option<usize>,
        skipped: u64,
        workers_held_back: bool,
    ) -> Result<Assembly> {
        let skip_bad = options.on_error == OnError::Skip;
        let mut collator = match samples {
            Samples::Indexed(source) => {
                let image = options.image_stages(source.fields())?.map(Arc::new);
                Collator::new(Arc::clone(source), options.ragged_fields(), image, skip_bad)?
            }
            Samples::Streamed(fields) => {
                let image = options.image_stages(fields)?.map(Arc::new);
                Collator::for_fields(fields, options.ragged_fields(), image, skip_bad)?
            }
        };
        if let Some(required) = self.cast_on_device {
            collator.cast_on_device(required)?;
        }
        let share = match self.gpu_decode {
            Some((share, required)) => {
                let share = Arc::new(DecodeShare::new(share));
                collator.decode_on_device(
                    Arc::clone(&share),
                    required,
                    options.max_image_pixels,
                )?;
                collator.decodes_on_device().then_some(share)
            }
            None => None,
        };
        let prefetch = options.prefetch_factor;
        // The memory budget bounds the in-flight cap; the prefetch thread holds up to
        // `COPIES_IN_FLIGHT` more slabs while their copies run.
        let largest = options
            .batch_size
            .min(per_rank.unwrap_or(options.batch_size).max(1));
        let page = crate::arena::page_size();
        let batch_bytes = collator.batch_bytes(largest).div_ceil(page) * page;
        let device_batch_bytes = if self.feed {
            collator.device_batch_bytes(largest)?.div_ceil(page) * page
        } else {
            0
        };
        let reserved = if self.feed {
            crate::cuda::COPIES_IN_FLIGHT
        } else {
            0
        };
        let budget = BudgetPlan::new(
            options.resolved_memory_budget(),
            batch_bytes as u64,
            self.workers.max(1) * prefetch,
            reserved,
            largest,
        )?;
        let fit = budget.fit(reserved);
        let capacity = if options.autotune {
            fit.min(self.cores.max(self.workers) * crate::autotune::MAX_PREFETCH.max(prefetch))
                .max(budget.cap)
        } else {
            budget.cap
        };
        let arena = Arena::new(self.pin, self.registrar.clone());
        arena.set_budget(budget.budget);
        let trace = options.trace.as_deref().map(Trace::create).transpose()?;
        let stats = Arc::new(StatsRecorder::new(trace));
        stats.set_budget(&budget);
        stats.set_prefetch(prefetch);
        if let Some(share) = &share {
            stats.set_gpu_decode_share(share.get());
        }
        if let Some(trace) = stats.trace().filter(|_| options.autotune) {
            trace.name_track(Track::Control, "autotune".into());
        }
        stats.add_skipped(skipped);
        let builder = Arc::new(Builder {
            collator,
            arena,
            stats: Arc::clone(&stats),
            stop: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            workers_held_back,
            device_batch_bytes,
        });
        let depth = Depth::new(self.workers);
        let (pool, local) = if self.workers > 0 {
            let pool = Pool::start(Arc::clone(&builder), self.workers, capacity)?;
            stats.set_depth(depth.of(budget.cap));
            (Some(pool), None)
        } else {
            stats.set_current_workers(1);
            let ctx = WorkerCtx::new(&stats, |_| "stoker-builder (calling thread)".into());
            (None, Some(ctx))
        };
        Ok(Assembly {
            builder,
            stats,
            pool,
            local,
            cap: Cap {
                cap: budget.cap,
                prefetch,
                fit,
                autotune: options.autotune.then(|| Controller::new(self.cores, fit)),
                // An explicit share stays as set; `auto` is autotune's to move.
                gpu_share: share.filter(|_| {
                    options.jpeg_decoder != Some(JpegDecoder::Gpu)
                        && options.gpu_decode_share.is_none()
                }),
            },
            capacity,
            depth,
        })
    }
}

/// The stats handle a loader over `builder` hands out.
pub(super) fn stats_handle(builder: &Builder, launch: Launch) -> StatsHandle {
    StatsHandle {
        recorder: Arc::clone(&builder.stats),
        arena: builder.arena.clone(),
        launch,
    }
}

/// The in-flight cap, and what may move it: autotune, within what `memory_budget` holds.
pub(super) struct Cap {
    /// Batches in flight at most now: `max(1, workers) × prefetch`, lowered to `fit`.
    pub(super) cap: usize,
    /// Batches in flight per worker (`prefetch_factor`, or autotune's choice).
    prefetch: usize,
    /// Batches the memory budget holds in flight: the ceiling of `cap`.
    fit: usize,
    /// The controller of `autotune=true`.
    autotune: Option<Controller>,
    /// The share of samples the device decodes, when GPU decoding is on (autotune moves it
    /// under `jpeg_decoder=auto`).
    gpu_share: Option<Arc<DecodeShare>>,
}

impl Cap {
    /// Lets the autotune controller look at the last window, and applies its decision: the
    /// pool's workers, the depth's floor and the cap, all recorded in `stats`. Returns whether
    /// anything changed.
    pub(super) fn tune(
        &mut self,
        pool: Option<&mut Pool>,
        depth: &mut Depth,
        stats: &StatsRecorder,
    ) -> Result<bool> {
        let (Some(ctl), Some(pool)) = (&mut self.autotune, pool) else {
            return Ok(false);
        };
        let now = Instant::now();
        if !ctl.due(now) {
            return Ok(false);
        }
        let (batches, wait_ns, busy_ns) = stats.totals();
        let observation = Observation {
            at: now,
            batches,
            wait_ns,
            busy_ns,
            cpu_ns: crate::autotune::process_cpu_ns(),
        };
        let share = self.gpu_share.as_ref().map(|s| s.get());
        let Some(d) = ctl.observe(observation, (pool.workers(), self.prefetch), share) else {
            return Ok(false);
        };
        if let (Some(gpu), Some(share)) = (&self.gpu_share, d.gpu_decode_share) {
            gpu.set(share);
            stats.set_gpu_decode_share(share);
        }
        pool.resize(d.workers)?;
        depth.set_workers(d.workers);
        self.prefetch = d.prefetch;
        let requested = d.workers.max(1) * d.prefetch;
        self.cap = requested.min(self.fit).max(1);
        stats.set_cap(self.cap, requested);
        stats.set_depth(depth.of(self.cap));
        stats.decided(now, &d);
        Ok(true)
    }
}
