//! One batch built in parts by several workers at once ([`PartedBatch`]): each part runs phase 1
//! and phase 2 on its own range of slots of one shared slab, and whoever ends last finishes the
//! batch with the error a whole build would have reported, or verifies and mixes it once.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Instant;

use crate::arena::{Arena, SlabLease};
use crate::batch::{Batch, DeviceDecodes, FieldMeta};
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
        /// The images of its slots left to the device's decoder.
        routed: DeviceDecodes,
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
            Ok(None) => {
                return PartOutcome::Written {
                    skipped: 0,
                    routed: DeviceDecodes::default(),
                }
            }
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
                routed: std::mem::take(&mut pixels.routed),
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
        let mut routed = DeviceDecodes::default();
        let mut first: Option<(Failure, Error)> = None;
        let outcomes = outcomes
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner);
        for (part, outcome) in outcomes.into_iter().enumerate() {
            let (failure, error) = match outcome {
                Some(PartOutcome::Written {
                    skipped: s,
                    routed: part_routed,
                }) => {
                    skipped += s;
                    routed.append(part_routed);
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
        self.finish(key, &FromSource(source), n, (metas, lease), skipped, routed)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::collate::tests::{counting, image_stages, key, Flaky, Owned};
    use crate::dtype::DType;
    use crate::source::{MemorySource, Source};

    const DRAWS: Draws = Draws::Positions {
        first: 100,
        stride: 2,
    };

    /// Builds `indices` in `parts` parts, the parts run in the order `order` (the rest never
    /// run), and finishes the batch.
    fn build_in_parts(
        c: &Collator,
        indices: &[usize],
        parts: usize,
        order: &[usize],
    ) -> Result<Batch> {
        let batch = c
            .parted(key(9, 1), indices.len(), parts)
            .expect("a split batch");
        let arena = Arena::new(false, None);
        for &part in order {
            c.build_part(
                &batch,
                part,
                indices,
                DRAWS,
                &arena,
                &mut Scratch::default(),
            );
        }
        c.finish_parted(batch)
    }

    fn whole(c: &Collator, indices: &[usize]) -> Result<Batch> {
        let arena = Arena::new(false, None);
        c.build(key(9, 1), indices, DRAWS, &arena, &mut Scratch::default())
    }

    /// `n` samples: a 2x3 uint8 image (flipped at random) and `label = i % 3`, mixed by
    /// `transform` when it says so; `bad` samples do not read.
    fn images(n: usize, bad: &[usize], transform: &str, skip_bad: bool) -> Collator {
        let pixels = (0..n * 18).map(|i| (i * 13 % 251) as u8).collect();
        let labels = (0..n as i64).flat_map(|i| (i % 3).to_ne_bytes()).collect();
        let source: Arc<dyn Source> = Arc::new(
            MemorySource::new()
                .with_tensor("image", DType::U8, &[2, 3, 3], pixels)
                .and_then(|s| s.with_tensor("label", DType::I64, &[], labels))
                .unwrap(),
        );
        let stages = Arc::new(image_stages(Some(transform)));
        let source = Arc::new(Flaky::new(source, bad));
        Collator::new(source, None, Some(stages), skip_bad).unwrap()
    }

    fn field(batch: &Batch, name: &str) -> Vec<u8> {
        batch.field_by_name(name).unwrap().data.unwrap().to_vec()
    }

    #[test]
    fn a_batch_built_in_parts_is_the_batch_built_whole() {
        let spec = "hflip | mixup(alpha=1.0, num_classes=3)";
        let c = images(30, &[4], spec, true);
        let indices = [3, 4, 17, 0, 29, 8, 11];
        let want = whole(&c, &indices).unwrap();
        assert_eq!(want.skipped(), 1);
        for order in [[0, 1, 2], [2, 0, 1]] {
            let got = build_in_parts(&c, &indices, 3, &order).unwrap();
            assert_eq!(got.skipped(), want.skipped());
            assert_eq!(got.field_metas(), want.field_metas());
            for name in ["image", "label"] {
                assert_eq!(
                    field(&got, name),
                    field(&want, name),
                    "{name}, order {order:?}"
                );
            }
        }
    }

    #[test]
    fn only_batches_whose_layout_is_known_before_reading_are_split() {
        let c = Collator::new(counting(100), None, None, false).unwrap();
        let ranges = |n, parts| c.parted(key(0, 0), n, parts).map(|b| b.ranges);
        assert_eq!(ranges(10, 4), Some(vec![0..2, 2..5, 5..7, 7..10]));
        assert_eq!(
            ranges(3, 8).map(|r| r.len()),
            Some(3),
            "one sample a part at least"
        );
        assert_eq!(ranges(100, 20).map(|r| r.len()), Some(MAX_PARTS));
        assert_eq!(ranges(10, 1), None);
        assert_eq!(ranges(1, 4), None);
        // A ragged field's padded length depends on every sample of the batch.
        let ragged = MemorySource::new()
            .with_ragged("text", DType::U8, &[], vec![vec![1], vec![1, 2]])
            .unwrap();
        let c = Collator::new(Arc::new(ragged), None, None, false).unwrap();
        assert!(c.parted(key(0, 0), 2, 2).is_none());
        // Streamed samples have no indices to hand to parts.
        let c = Collator::for_fields(&Owned::fields(), None, None, false).unwrap();
        assert!(c.parted(key(0, 0), 4, 2).is_none());
    }

    fn failed_index(result: Result<Batch>) -> u64 {
        match result {
            Err(Error::Sample { index, .. }) => index,
            other => panic!("expected a sample error, got {:?}", other.map(|b| b.len())),
        }
    }

    #[test]
    fn a_read_failure_is_reported_before_a_write_failure_of_an_earlier_part() {
        // Two parts of two: sample 0's label (5) is outside the 3 classes, so part 0 fails
        // writing; sample 3 does not read, so part 1 fails reading. A whole build reads every
        // slot before it writes any, so it stops at sample 3.
        let labels = [5i64, 0, 1, 2]
            .iter()
            .flat_map(|l| l.to_ne_bytes())
            .collect();
        let source: Arc<dyn Source> = Arc::new(
            MemorySource::new()
                .with_tensor("label", DType::I64, &[], labels)
                .unwrap(),
        );
        let stages = Arc::new(image_stages(Some("mixup(alpha=1.0, num_classes=3)")));
        let c = Collator::new(
            Arc::new(Flaky::new(source, &[3])),
            None,
            Some(stages),
            false,
        )
        .unwrap();
        assert_eq!(failed_index(whole(&c, &[0, 1, 2, 3])), 3);
        for order in [[0, 1], [1, 0]] {
            let got = build_in_parts(&c, &[0, 1, 2, 3], 2, &order);
            assert_eq!(failed_index(got), 3, "order {order:?}");
        }
        // Failures keep a whole build's order: aborted, read, slab, write.
        assert!(Failure::Aborted < Failure::Read);
        assert!(Failure::Read < Failure::Slab);
        assert!(Failure::Slab < Failure::Write);
    }

    #[test]
    fn among_parts_failing_alike_the_first_parts_error_is_the_batchs() {
        let c = images(8, &[1, 6], "hflip", false);
        let indices: Vec<usize> = (0..8).collect();
        assert_eq!(failed_index(whole(&c, &indices)), 1);
        for order in [[0, 1, 2, 3], [3, 2, 1, 0]] {
            let got = build_in_parts(&c, &indices, 4, &order);
            assert_eq!(failed_index(got), 1, "order {order:?}");
        }
    }

    #[test]
    fn a_part_that_ended_outside_the_build_outranks_any_sample_error() {
        let c = images(4, &[0], "hflip", false);
        let batch = c.parted(key(0, 0), 4, 2).unwrap();
        let arena = Arena::new(false, None);
        batch.abort(1, Error::Internal("part 1 panicked".into()));
        c.build_part(
            &batch,
            0,
            &[0, 1, 2, 3],
            DRAWS,
            &arena,
            &mut Scratch::default(),
        );
        // A part's first outcome stands.
        batch.abort(1, Error::Internal("recorded twice".into()));
        match c.finish_parted(batch) {
            Err(Error::Internal(m)) => assert_eq!(m, "part 1 panicked"),
            other => panic!("expected the abort, got {:?}", other.map(|b| b.len())),
        }
    }

    #[test]
    fn a_part_that_never_ran_fails_the_batch() {
        let c = images(4, &[], "hflip", false);
        match build_in_parts(&c, &[0, 1, 2, 3], 2, &[0]) {
            Err(Error::Internal(m)) => assert_eq!(m, "part 1 of batch 0 of epoch 1 never ran"),
            other => panic!(
                "expected an internal error, got {:?}",
                other.map(|b| b.len())
            ),
        }
    }

    #[test]
    fn the_slab_is_taken_once_and_each_parts_slots_handed_out_once() {
        let c = images(6, &[], "hflip", false);
        let batch = c.parted(key(0, 0), 6, 3).unwrap();
        let arena = Arena::new(false, None);
        let mut spans = Spans::default();
        let first = batch.slab(&arena, &mut spans).unwrap().unwrap().as_ptr();
        let again = batch.slab(&arena, &mut spans).unwrap().unwrap();
        assert_eq!(again.as_ptr(), first);
        assert_eq!(arena.counters().slabs_mapped, 1);
        assert_eq!(spans.spans().len(), 1, "only the taking is timed");
        assert!(batch.part_slots(1, again).is_some(), "part 1's slots");
        assert!(batch.part_slots(1, again).is_none(), "handed out once");
        assert!(batch.part_slots(3, again).is_none(), "no part 3");
    }
}
