//! One batch built in parts by several workers at once ([`PartedBatch`]): each part runs phase 1
//! and phase 2 on its own range of slots of one shared slab, and whoever ends last finishes the
//! batch with the error a whole build would have reported, or verifies and mixes it once.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Instant;

use crate::arena::{Arena, SlabLease};
use crate::batch::{Batch, FieldMeta};
use crate::error::{Error, Result};
use crate::sampler::Draws;
use crate::span::{SpanKind, Stage};
use crate::stats::Spans;

use super::pick::{FromSource, Pick};
use super::write::Slots;
use super::{BatchKey, Collator, Scratch};

/// Most parts one batch is split into (more would leave each part only a few samples).
pub(crate) const MAX_PARTS: usize = 8;

/// One batch built in parts by several workers at once (the first batches of a loader: see
/// `loader::host`). Each part reads and writes its own contiguous range of slots into one shared
/// slab; whoever ends last finishes the batch ([`Collator::finish_parted`]).
///
/// Only a batch whose layout is known before any sample is read is split: one without ragged
/// fields, whose padded length is the batch's longest sample. Each part can then run both
/// phases on its own slots — reading is parallel too, and no sample read by one thread is lent
/// to another — where splitting only phase 2 would first read the whole batch on one thread.
/// The batch is the one [`Collator::build`] makes: every random choice is keyed by the slot's
/// draw and a replacement by the bad sample's index, never by who builds it; and the error
/// reported is the one the whole build would have stopped at (see [`Failure`]).
pub(crate) struct PartedBatch {
    key: BatchKey,
    n: usize,
    /// The parts' slot ranges: disjoint, in order, covering `0..n`.
    ranges: Vec<Range<usize>>,
    /// Whether each part's slots were handed out (each is, once).
    taken: Vec<AtomicBool>,
    metas: Vec<FieldMeta>,
    bytes: usize,
    /// The slab, taken from the arena by the first part to need it; `None` if that failed (the
    /// part that tried reports why).
    slab: OnceLock<Option<SlabLease>>,
    /// What each part did, by part.
    outcomes: Mutex<Vec<Option<PartOutcome>>>,
}

/// What one part of a [`PartedBatch`] did.
enum PartOutcome {
    /// Its slots are written; `skipped` samples were replaced (on_error=skip).
    Written {
        skipped: usize,
    },
    Failed(Failure, Error),
}

/// Where a part failed, in the order a whole build meets these failures: phase 1 reads every
/// slot before the slab is taken, and phase 2 writes every slot after. Among parts failing
/// alike, the first part's error is the batch's (a part stops at its first failing slot, so
/// that is the batch's first failing slot); a part that ended outside the build (a panic, a
/// discarded task) wins over any sample's error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Failure {
    Aborted,
    Read,
    Slab,
    Write,
}

impl PartedBatch {
    /// Parts the batch has.
    pub(crate) fn parts(&self) -> usize {
        self.ranges.len()
    }

    /// Records that part `part` ended without building its slots (a panic, a discarded task),
    /// with the error the batch then fails with.
    pub(crate) fn abort(&self, part: usize, error: Error) {
        self.record(part, PartOutcome::Failed(Failure::Aborted, error));
    }

    fn record(&self, part: usize, outcome: PartOutcome) {
        let mut outcomes = self.outcomes.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(slot @ None) = outcomes.get_mut(part) {
            *slot = Some(outcome);
        }
    }

    /// The slab, taken from `arena` by the first part to ask (the others wait for it; taking it
    /// never waits for a part); `Ok(None)` when another part failed to take it.
    fn slab(&self, arena: &Arena, spans: &mut Spans) -> Result<Option<&SlabLease>> {
        let mut failed = None;
        let slab = self.slab.get_or_init(|| {
            let start = Instant::now();
            let lease = arena.acquire(self.bytes);
            spans.push(SpanKind::Stage(Stage::Collate), usize::MAX, 0, start);
            lease.map_err(|e| failed = Some(e)).ok()
        });
        match failed {
            Some(e) => Err(e),
            None => Ok(slab.as_ref()),
        }
    }

    /// Part `part`'s slots of every field in `lease` (this batch's slab); `None` if they were
    /// handed out before.
    fn part_slots<'s>(&'s self, part: usize, lease: &'s SlabLease) -> Option<Slots<'s>> {
        let range = self.ranges.get(part)?;
        if self.taken[part].swap(true, Ordering::AcqRel) {
            return None;
        }
        let base = lease.as_ptr();
        let fields = self
            .metas
            .iter()
            .map(|meta| {
                let size = meta.num_bytes() / meta.shape[0].max(1);
                // SAFETY: in bounds: `layout` placed this field at `offset..offset + num_bytes`
                // (`size` bytes per slot, `n` slots) inside `bytes`, the lease's length, and
                // `range` lies in `0..n`. Valid for writes: the lease maps its slab read-write,
                // and the slices borrow `self`, which holds the lease; only
                // `Collator::finish_parted`, owning `self`, takes it out. Not aliased: fields
                // do not overlap (each starts past the end of the one before), parts' ranges
                // do not overlap (`Collator::parted`), `taken` hands each part's slots out
                // once, and nothing else touches the slab while `self` is shared. Parts write
                // from several threads; the finisher reads after `Arc::into_inner` on the
                // parts' shared handle, whose release/acquire orders every part's writes
                // before it.
                let bytes = unsafe {
                    std::slice::from_raw_parts_mut(
                        base.add(meta.offset + range.start * size),
                        range.len() * size,
                    )
                };
                (bytes, size)
            })
            .collect();
        Some(Slots::range(range.start, fields))
    }
}

impl Collator {
    /// Batch `key` of `n` samples split into (at most) `parts` parts to build on as many
    /// workers, or `None` when it cannot be: a layout that depends on the samples (ragged
    /// fields), streamed samples, or fewer than two parts of at least one sample each.
    pub(crate) fn parted(&self, key: BatchKey, n: usize, parts: usize) -> Option<PartedBatch> {
        let parts = parts.min(n).min(MAX_PARTS);
        if parts < 2 || self.has_ragged() || self.source.is_none() {
            return None;
        }
        let (metas, bytes) = self.layout(n, &vec![0; self.outputs.len()]);
        Some(PartedBatch {
            key,
            n,
            ranges: (0..parts)
                .map(|p| p * n / parts..(p + 1) * n / parts)
                .collect(),
            taken: (0..parts).map(|_| AtomicBool::new(false)).collect(),
            metas,
            bytes,
            slab: OnceLock::new(),
            outcomes: Mutex::new((0..parts).map(|_| None).collect()),
        })
    }

    /// Builds part `part` of `batch`, whose samples are `indices` of the source: phase 1 then
    /// phase 2 on the part's slots, into the slab the first part takes from `arena`. The
    /// outcome is recorded in `batch`; the stages in `scratch.spans`.
    pub(crate) fn build_part(
        &self,
        batch: &PartedBatch,
        part: usize,
        indices: &[usize],
        draws: Draws,
        arena: &Arena,
        scratch: &mut Scratch,
    ) {
        scratch.spans.clear();
        let outcome = match self.source.as_deref() {
            Some(source) => self.write_part(
                batch,
                part,
                &FromSource(source),
                indices,
                draws,
                arena,
                scratch,
            ),
            None => PartOutcome::Failed(
                Failure::Aborted,
                Error::Internal("a collator of streamed samples was asked for indices".into()),
            ),
        };
        batch.record(part, outcome);
    }

    #[allow(clippy::too_many_arguments)]
    fn write_part(
        &self,
        batch: &PartedBatch,
        part: usize,
        pick: &dyn Pick,
        indices: &[usize],
        draws: Draws,
        arena: &Arena,
        scratch: &mut Scratch,
    ) -> PartOutcome {
        let Some(range) = batch.ranges.get(part).cloned() else {
            return PartOutcome::Failed(
                Failure::Aborted,
                Error::Internal(format!("batch {} has no part {part}", batch.key.position)),
            );
        };
        let key = batch.key;
        let Scratch {
            reads,
            spare,
            pixels,
            spans,
        } = scratch;
        if reads.len() < range.len() {
            reads.resize_with(range.len(), Vec::new);
        }
        let (samples, read_skipped) = match self.read_slots(key, pick, indices, range, reads, spans)
        {
            Ok(read) => read,
            Err(e) => return PartOutcome::Failed(Failure::Read, e),
        };
        let lease = match batch.slab(arena, spans) {
            Ok(Some(lease)) => lease,
            // Another part failed to take the slab and reports why.
            Ok(None) => return PartOutcome::Written { skipped: 0 },
            Err(e) => return PartOutcome::Failed(Failure::Slab, e),
        };
        let Some(mut slots) = batch.part_slots(part, lease) else {
            return PartOutcome::Failed(
                Failure::Aborted,
                Error::Internal(format!(
                    "part {part} of batch {} was built twice",
                    key.position
                )),
            );
        };
        // No ragged field: nothing is padded.
        let max_len = vec![0; self.outputs.len()];
        match self.write_slots(
            key,
            pick,
            indices,
            Some(draws),
            &samples,
            &max_len,
            &mut slots,
            spare,
            pixels,
            spans,
        ) {
            Ok(skipped) => PartOutcome::Written {
                skipped: read_skipped + skipped,
            },
            Err(e) => PartOutcome::Failed(Failure::Write, e),
        }
    }

    /// The batch of `batch`'s parts once every part has ended: the error the whole build would
    /// have reported first (see [`Failure`]), or the batch, verified and mixed (mixup/cutmix)
    /// here, once.
    pub(crate) fn finish_parted(&self, batch: PartedBatch) -> Result<Batch> {
        let PartedBatch {
            key,
            n,
            metas,
            slab,
            outcomes,
            ..
        } = batch;
        let mut skipped = 0;
        let mut first: Option<(Failure, Error)> = None;
        let outcomes = outcomes
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner);
        for (part, outcome) in outcomes.into_iter().enumerate() {
            let (failure, error) = match outcome {
                Some(PartOutcome::Written { skipped: s }) => {
                    skipped += s;
                    continue;
                }
                Some(PartOutcome::Failed(failure, error)) => (failure, error),
                None => (
                    Failure::Aborted,
                    Error::Internal(format!(
                        "part {part} of batch {} of epoch {} never ran",
                        key.position, key.epoch
                    )),
                ),
            };
            // Parts in order: on a tie the first part's error stays.
            if first.as_ref().is_none_or(|(f, _)| failure < *f) {
                first = Some((failure, error));
            }
        }
        if let Some((_, error)) = first {
            return Err(error);
        }
        let lease = slab.into_inner().flatten().ok_or_else(|| {
            Error::Internal(format!(
                "batch {} of epoch {} was written without a slab",
                key.position, key.epoch
            ))
        })?;
        let source = self.source.as_deref().ok_or_else(|| {
            Error::Internal("a collator of streamed samples finished a split batch".into())
        })?;
        self.finish(key, &FromSource(source), n, metas, lease, skipped)
    }
}

