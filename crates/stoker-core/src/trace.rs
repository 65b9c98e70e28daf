//! The timeline trace (`trace=PATH`): Chrome trace-event JSON, the format PyTorch's profiler
//! exports, which Perfetto (ui.perfetto.dev) and chrome://tracing open.
//!
//! One track (`tid`) per thread:
//! - each worker (`stoker-worker-N`, or the calling thread with `num_workers=0`): a `batch` span
//!   per batch built; inside it a `sample` span per sample and phase (phase 1 reads every sample
//!   of the batch, phase 2 writes every slot), and inside those the stages `read`, `decode`,
//!   `transform`, `collate` (complete events, `"ph": "X"`, that nest). A batch split across
//!   workers has one `batch` span per part, on the track of the worker that built it, with
//!   `part` and `parts` among its arguments and the samples of that part's slots inside;
//! - `stoker-prefetch`: an `h2d` span per batch copied to the device;
//! - `consumer`: a `wait` span per `next()` call that returned a batch, and a `deliver` instant
//!   when the batch was handed over;
//! - `autotune`: every decision of the controller (`autotune=true`), as an instant event with
//!   the new settings and its reason, and a counter of the worker count and prefetch depth.
//!
//! Bounded in size: the trace keeps a ring of the events of the last [`TRACE_BATCHES`] batches
//! of each track (older ones are dropped), so a loader running for days with `trace` set holds
//! a few megabytes at most. The file is written when the loader is dropped (and by
//! `Loader::write_trace`), replacing what was there.
//!
//! The JSON is written by hand: every name is a fixed ASCII string and every value a number, so
//! no escaping is ever needed and a serializer would add a dependency to the core for nothing.

use std::collections::{BTreeMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use crate::error::{Error, Result};
use crate::span::{Span, SpanKind, NO_SLOT};

/// Batches whose events the trace keeps, per track.
pub const TRACE_BATCHES: usize = 1024;

/// A thread's track.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Track {
    Consumer,
    Prefetch,
    /// The autotune controller's decisions.
    Control,
    /// A worker, by its number.
    Worker(usize),
}

impl Track {
    fn tid(self) -> u64 {
        match self {
            Track::Consumer => 1,
            Track::Prefetch => 2,
            Track::Control => 3,
            Track::Worker(n) => 10 + n as u64,
        }
    }
}

/// Arguments of one event.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Args {
    None,
    Batch {
        epoch: u64,
        position: u64,
    },
    /// Part `part` (from 0) of `parts` of a batch split across workers.
    Part {
        epoch: u64,
        position: u64,
        part: u32,
        parts: u32,
    },
    /// A sample: its dataset index and its slot in the batch (`phase`: 0 read, 1 write).
    Sample {
        index: u64,
        slot: u32,
        phase: u8,
    },
    /// A stage of one sample.
    Index {
        index: u64,
    },
    /// An autotune decision: the new settings, the readiness that prompted it, and why.
    Decision {
        workers: u64,
        prefetch_factor: u64,
        /// The GPU decode share, when GPU decoding is on.
        gpu_decode_share: Option<f64>,
        readiness: f64,
        reason: &'static str,
    },
    /// The GPU decode share from now on (at the start, and at each autotune move).
    Share {
        share: f64,
    },
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct TraceEvent {
    name: &'static str,
    start: Instant,
    /// `None` for an instant event.
    end: Option<Instant>,
    args: Args,
}

impl TraceEvent {
    pub(crate) fn batch(
        name: &'static str,
        epoch: u64,
        position: usize,
        start: Instant,
        end: Instant,
    ) -> TraceEvent {
        TraceEvent {
            name,
            start,
            end: Some(end),
            args: Args::Batch {
                epoch,
                position: position as u64,
            },
        }
    }

    pub(crate) fn instant(name: &'static str, at: Instant, args: Args) -> TraceEvent {
        TraceEvent {
            name,
            start: at,
            end: None,
            args,
        }
    }
}

/// The events of one batch (or one decision) on one track.
struct Group {
    track: Track,
    events: Vec<TraceEvent>,
}

struct Ring {
    groups: VecDeque<Group>,
    /// Groups kept per track.
    per_track: BTreeMap<Track, usize>,
    names: BTreeMap<Track, String>,
}

/// A bounded in-memory trace, written as JSON on request.
pub struct Trace {
    path: PathBuf,
    origin: Instant,
    keep: usize,
    ring: Mutex<Ring>,
}

impl Trace {
    /// A trace to be written to `path`, created (empty) now so that an unwritable path fails when
    /// the loader is made, not when it is dropped.
    pub(crate) fn create(path: &Path) -> Result<Trace> {
        std::fs::File::create(path).map_err(|e| {
            Error::option("trace", format!("cannot create {}: {e}", path.display()))
        })?;
        let mut names = BTreeMap::new();
        names.insert(Track::Consumer, "consumer (next)".to_owned());
        Ok(Trace {
            path: path.to_owned(),
            origin: Instant::now(),
            keep: TRACE_BATCHES,
            ring: Mutex::new(Ring {
                groups: VecDeque::new(),
                per_track: BTreeMap::new(),
                names,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The file the trace is written to (option `trace`).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Names a track (its thread's name in the viewer).
    pub(crate) fn name_track(&self, track: Track, name: String) {
        self.lock().names.insert(track, name);
    }

    /// Adds one group of events, dropping the oldest group of the same track beyond the limit.
    pub(crate) fn push(&self, track: Track, events: Vec<TraceEvent>) {
        let mut ring = self.lock();
        let count = ring.per_track.entry(track).or_insert(0);
        *count += 1;
        if *count > self.keep {
            *count -= 1;
            if let Some(i) = ring.groups.iter().position(|g| g.track == track) {
                ring.groups.remove(i);
            }
        }
        ring.groups.push_back(Group { track, events });
    }

    /// The consumer asked for a batch at `asked` and got batch `(epoch, position)` at `now`.
    pub(crate) fn delivered(&self, epoch: u64, position: usize, asked: Instant, now: Instant) {
        let wait = TraceEvent::batch("wait", epoch, position, asked, now);
        let deliver = TraceEvent::instant(
            "deliver",
            now,
            Args::Batch {
                epoch,
                position: position as u64,
            },
        );
        self.push(Track::Consumer, vec![wait, deliver]);
    }

    /// An autotune decision taken at `at`.
    pub(crate) fn decision(&self, at: Instant, args: Args) {
        self.push(
            Track::Control,
            vec![TraceEvent::instant("autotune", at, args)],
        );
    }

    /// The GPU decode share from `at` on, on the prefetch thread's track: an instant and a
    /// counter.
    pub(crate) fn share(&self, at: Instant, share: f64) {
        self.push(
            Track::Prefetch,
            vec![TraceEvent::instant(
                "gpu_decode_share",
                at,
                Args::Share { share },
            )],
        );
    }

    /// A worker's batch: the `batch` span from `start` to `end` around the spans it recorded.
    pub(crate) fn batch_built(
        &self,
        worker: usize,
        epoch: u64,
        position: usize,
        start: Instant,
        end: Instant,
        spans: &[Span],
    ) {
        let batch = TraceEvent::batch("batch", epoch, position, start, end);
        self.built(worker, batch, spans);
    }

    /// Part `part.0` of `part.1` of a batch split across workers, built by `worker`: a `batch`
    /// span with the part in its arguments, around the spans recorded.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn part_built(
        &self,
        worker: usize,
        epoch: u64,
        position: usize,
        (part, parts): (usize, usize),
        start: Instant,
        end: Instant,
        spans: &[Span],
    ) {
        let args = Args::Part {
            epoch,
            position: position as u64,
            part: part as u32,
            parts: parts as u32,
        };
        let batch = TraceEvent {
            name: "batch",
            start,
            end: Some(end),
            args,
        };
        self.built(worker, batch, spans);
    }

    fn built(&self, worker: usize, batch: TraceEvent, spans: &[Span]) {
        let mut events = Vec::with_capacity(spans.len() + 1);
        events.push(batch);
        for s in spans {
            let (name, args) = match s.kind {
                SpanKind::Stage(stage) if s.slot == NO_SLOT => (stage.name(), Args::None),
                SpanKind::Stage(stage) => (stage.name(), Args::Index { index: s.index }),
                SpanKind::SampleRead | SpanKind::SampleWrite => (
                    "sample",
                    Args::Sample {
                        index: s.index,
                        slot: s.slot,
                        phase: u8::from(s.kind == SpanKind::SampleWrite),
                    },
                ),
            };
            events.push(TraceEvent {
                name,
                start: s.start,
                end: Some(s.end),
                args,
            });
        }
        self.push(Track::Worker(worker), events);
    }

    /// Writes the trace to its path (replacing the file).
    pub fn write(&self) -> Result<()> {
        let io = |e: std::io::Error| Error::Io {
            path: self.path.clone(),
            reason: format!("writing the trace: {e}"),
        };
        let file = std::fs::File::create(&self.path).map_err(io)?;
        let mut out = std::io::BufWriter::new(file);
        self.write_to(&mut out).map_err(io)?;
        out.flush().map_err(io)
    }

    fn write_to(&self, out: &mut impl Write) -> std::io::Result<()> {
        let ring = self.lock();
        let pid = std::process::id();
        write!(
            out,
            "{{\"displayTimeUnit\":\"ms\",\"otherData\":{{\"producer\":\"stoker {}\",\"batches_kept_per_track\":{}}},\"traceEvents\":[",
            env!("CARGO_PKG_VERSION"),
            self.keep
        )?;
        write!(
            out,
            "\n{{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":{pid},\"tid\":0,\"args\":{{\"name\":\"stoker\"}}}}"
        )?;
        for (track, name) in &ring.names {
            // Thread names are ours (`stoker-worker-3`): no character needs escaping, but a
            // stray quote or backslash must not break the file.
            let name: String = name.chars().filter(|c| *c != '"' && *c != '\\').collect();
            write!(
                out,
                ",\n{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":{pid},\"tid\":{},\"args\":{{\"name\":\"{name}\"}}}}",
                track.tid()
            )?;
            write!(
                out,
                ",\n{{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":{pid},\"tid\":{},\"args\":{{\"sort_index\":{}}}}}",
                track.tid(),
                track.tid()
            )?;
        }
        for group in &ring.groups {
            let tid = group.track.tid();
            for e in &group.events {
                let ts = micros(e.start.saturating_duration_since(self.origin).as_nanos());
                match e.end {
                    Some(end) => write!(
                        out,
                        ",\n{{\"ph\":\"X\",\"name\":\"{}\",\"pid\":{pid},\"tid\":{tid},\"ts\":{ts},\"dur\":{}",
                        e.name,
                        micros(end.saturating_duration_since(e.start).as_nanos())
                    )?,
                    None => write!(
                        out,
                        ",\n{{\"ph\":\"i\",\"s\":\"t\",\"name\":\"{}\",\"pid\":{pid},\"tid\":{tid},\"ts\":{ts}",
                        e.name
                    )?,
                }
                match e.args {
                    Args::None => write!(out, "}}")?,
                    Args::Batch { epoch, position } => write!(
                        out,
                        ",\"args\":{{\"epoch\":{epoch},\"position\":{position}}}}}"
                    )?,
                    Args::Part {
                        epoch,
                        position,
                        part,
                        parts,
                    } => write!(
                        out,
                        ",\"args\":{{\"epoch\":{epoch},\"position\":{position},\"part\":{part},\"parts\":{parts}}}}}"
                    )?,
                    Args::Sample { index, slot, phase } => write!(
                        out,
                        ",\"args\":{{\"index\":{index},\"slot\":{slot},\"phase\":\"{}\"}}}}",
                        if phase == 0 { "read" } else { "write" }
                    )?,
                    Args::Index { index } => write!(out, ",\"args\":{{\"index\":{index}}}}}")?,
                    Args::Decision {
                        workers,
                        prefetch_factor,
                        gpu_decode_share,
                        readiness,
                        reason,
                    } => {
                        // The share, when GPU decoding is on, as one more argument (its counter is
                        // the `Share` event beside it).
                        let share = gpu_decode_share
                            .map(|s| format!(",\"gpu_decode_share\":{s:.2}"))
                            .unwrap_or_default();
                        write!(
                            out,
                            ",\"args\":{{\"num_workers\":{workers},\"prefetch_factor\":{prefetch_factor}{share},\"readiness\":{readiness:.4},\"reason\":\"{reason}\"}}}}"
                        )?;
                        write!(
                            out,
                            ",\n{{\"ph\":\"C\",\"name\":\"autotune\",\"pid\":{pid},\"tid\":{tid},\"ts\":{ts},\"args\":{{\"num_workers\":{workers},\"prefetch_factor\":{prefetch_factor}}}}}"
                        )?;
                    }
                    Args::Share { share } => {
                        write!(out, ",\"args\":{{\"gpu_decode_share\":{share:.2}}}}}")?;
                        write!(
                            out,
                            ",\n{{\"ph\":\"C\",\"name\":\"gpu_decode_share\",\"pid\":{pid},\"tid\":{tid},\"ts\":{ts},\"args\":{{\"share\":{share:.2}}}}}"
                        )?;
                    }
                }
            }
        }
        writeln!(out, "\n]}}")
    }
}

/// Nanoseconds as microseconds with three decimals (exact: the trace format's unit is µs).
fn micros(ns: u128) -> String {
    format!("{}.{:03}", ns / 1000, ns % 1000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_ring_keeps_the_last_groups_of_each_track() {
        let dir = std::env::temp_dir().join(format!("stoker-trace-ring-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut trace = Trace::create(&dir.join("t.json")).unwrap();
        trace.keep = 3;
        let t0 = Instant::now();
        for i in 0..10 {
            let at = t0 + Duration::from_micros(i);
            trace.delivered(0, i as usize, at, at);
            if i < 2 {
                trace.push(
                    Track::Prefetch,
                    vec![TraceEvent::batch("h2d", 0, i as usize, at, at)],
                );
            }
        }
        let ring = trace.lock();
        let positions: Vec<(Track, u64)> = ring
            .groups
            .iter()
            .map(|g| match g.events[0].args {
                Args::Batch { position, .. } => (g.track, position),
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(
            positions,
            vec![
                (Track::Prefetch, 0),
                (Track::Prefetch, 1),
                (Track::Consumer, 7),
                (Track::Consumer, 8),
                (Track::Consumer, 9)
            ]
        );
        drop(ring);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn micros_are_exact() {
        assert_eq!(micros(0), "0.000");
        assert_eq!(micros(1_234_567), "1234.567");
        assert_eq!(micros(5), "0.005");
    }

    #[test]
    fn an_unwritable_path_names_the_key() {
        let err = Trace::create(Path::new("/nonexistent-dir/x/trace.json"))
            .err()
            .unwrap();
        assert!(err.to_string().contains("`trace`"), "{err}");
        assert!(err.to_string().contains("/nonexistent-dir"), "{err}");
    }
}
