use std::sync::Arc;

use super::*;
use crate::collate::pick::FromSource;
use crate::collate::tests::{counting, image_stages, key};
use crate::collate::Ragged;
use crate::dtype::DType;
use crate::source::MemorySource;

/// Reads `indices` of `c`'s source and writes them with phase 2 into a fresh slab laid out
/// for them: the layout, the slab and how many writes were replaced.
fn write_all(
    c: &Collator,
    seed: u64,
    indices: &[usize],
) -> Result<(Vec<FieldMeta>, Vec<u8>, usize)> {
    let source = c.source().expect("a map-style collator").clone();
    let pick = FromSource(&*source);
    let mut reads = vec![Vec::new(); indices.len()];
    let mut samples = Vec::new();
    for (&index, buf) in indices.iter().zip(reads.iter_mut()) {
        samples.push((index, pick.read(index, buf)?));
    }
    let extents = c.extents(&samples);
    let (mut metas, total) = c.layout(indices.len(), &extents);
    let mut slab = vec![0xAA; total];
    let mut slots = Slots::whole(&metas, &mut slab);
    let skipped = c.write_slots(
        key(seed, 0),
        &pick,
        indices,
        Some(Draws::ByIndex),
        &samples,
        &extents,
        &mut slots,
        &mut Vec::new(),
        &mut Pixels::default(),
        &mut Spans::default(),
    )?;
    c.cut_flat(&mut metas, &slab)?;
    Ok((metas, slab, skipped))
}

fn field<'s>(metas: &[FieldMeta], slab: &'s [u8], name: &str) -> &'s [u8] {
    let m = metas.iter().find(|m| m.name == name).expect("the field");
    &slab[m.offset..m.offset + m.num_bytes()]
}

fn i64s(bytes: &[u8]) -> Vec<i64> {
    bytes
        .chunks_exact(8)
        .map(|b| i64::from_ne_bytes(b.try_into().unwrap()))
        .collect()
}

#[test]
fn ragged_fields_are_padded_to_the_longest_with_lengths() {
    let row = |v: &[i32]| v.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
    let rows = vec![row(&[1]), row(&[2, 3, 4]), row(&[5, 6])];
    let source = MemorySource::new()
        .with_ragged("tokens", DType::I32, &[], rows)
        .unwrap();
    let c = Collator::new(Arc::new(source), Some(-1.0), None, false).unwrap();
    let (metas, slab, skipped) = write_all(&c, 0, &[0, 1, 2]).unwrap();
    assert_eq!(skipped, 0);
    let tokens: Vec<i32> = field(&metas, &slab, "tokens")
        .chunks_exact(4)
        .map(|b| i32::from_ne_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(tokens, [1, -1, -1, 2, 3, 4, 5, 6, -1]);
    assert_eq!(i64s(field(&metas, &slab, "tokens_lengths")), [1, 3, 2]);
}

#[test]
fn ragged_fields_under_offsets_lie_end_to_end_with_offsets() {
    let row = |v: &[i32]| v.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
    let rows = vec![row(&[1]), row(&[2, 3, 4]), row(&[]), row(&[5, 6])];
    let source = MemorySource::new()
        .with_ragged("tokens", DType::I32, &[], rows)
        .unwrap();
    // No pad value: nothing is padded.
    let c = Collator::new(Arc::new(source), Ragged::Offsets, None, false).unwrap();
    let (metas, slab, skipped) = write_all(&c, 0, &[0, 1, 2, 3]).unwrap();
    assert_eq!(skipped, 0);
    let names: Vec<_> = metas
        .iter()
        .map(|m| (m.name.as_str(), m.shape.clone()))
        .collect();
    assert_eq!(names, [("tokens", vec![6]), ("tokens_offsets", vec![5])]);
    let tokens: Vec<i32> = field(&metas, &slab, "tokens")
        .chunks_exact(4)
        .map(|b| i32::from_ne_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(tokens, [1, 2, 3, 4, 5, 6]);
    assert_eq!(
        i64s(field(&metas, &slab, "tokens_offsets")),
        [0, 1, 4, 4, 6]
    );
}

#[test]
fn a_batch_of_empty_samples_under_offsets_has_no_rows_and_zero_offsets() {
    let source = MemorySource::new()
        .with_ragged("boxes", DType::F32, &[4], vec![Vec::new(), Vec::new()])
        .unwrap();
    let c = Collator::new(Arc::new(source), Ragged::Offsets, None, false).unwrap();
    let (metas, slab, _) = write_all(&c, 0, &[0, 1]).unwrap();
    assert_eq!(metas[0].shape, [0, 4]);
    assert_eq!(i64s(field(&metas, &slab, "boxes_offsets")), [0, 0, 0]);
    let (metas, slab, _) = write_all(&c, 0, &[]).unwrap();
    assert_eq!(metas[0].shape, [0, 4]);
    assert_eq!(i64s(field(&metas, &slab, "boxes_offsets")), [0]);
}

#[test]
fn fixed_fields_are_copied_byte_for_byte_into_their_slots() {
    let c = Collator::new(counting(10), None, None, false).unwrap();
    let (metas, slab, _) = write_all(&c, 0, &[5, 2]).unwrap();
    assert_eq!(i64s(field(&metas, &slab, "x")), [5, 6, 7, 2, 3, 4]);
    assert_eq!(field(&metas, &slab, "y"), [5, 2]);
    // The alignment gap between the fields is left as it was.
    assert_eq!(slab[48], 0xAA);
}

#[test]
fn slots_of_a_part_are_addressed_by_the_batchs_slot_numbers() {
    let mut x = [0u8; 6];
    let mut y = [0u8; 2];
    let mut slots = Slots::range(4, vec![(&mut x[..], 3), (&mut y[..], 1)]);
    slots.slot(0, 5).copy_from_slice(&[7, 8, 9]);
    slots.slot(1, 4).copy_from_slice(&[1]);
    assert_eq!(x, [0, 0, 0, 7, 8, 9]);
    assert_eq!(y, [1, 0]);
}

/// Fields `tokens` (ragged bytes, sample `i` is `lens[i]` bytes of `i`, padded) and `label`
/// (int64, mixed into 3 classes).
fn labelled(lens: &[usize], labels: &[i64], skip_bad: bool) -> Collator {
    labelled_as(Ragged::Pad(None), lens, labels, skip_bad)
}

/// [`labelled`] with its ragged field batched as `ragged` says.
fn labelled_as(ragged: Ragged, lens: &[usize], labels: &[i64], skip_bad: bool) -> Collator {
    let rows = lens
        .iter()
        .enumerate()
        .map(|(i, &n)| vec![i as u8; n])
        .collect();
    let labels = labels.iter().flat_map(|l| l.to_ne_bytes()).collect();
    let source = MemorySource::new()
        .with_ragged("tokens", DType::U8, &[], rows)
        .and_then(|s| s.with_tensor("label", DType::I64, &[], labels))
        .unwrap();
    let stages = Arc::new(image_stages(Some("mixup(alpha=1.0, num_classes=3)")));
    Collator::new(Arc::new(source), ragged, Some(stages), skip_bad).unwrap()
}

#[test]
fn without_skip_a_failed_write_fails_with_the_samples_error() {
    let c = labelled(&[1, 1], &[0, 9], false);
    match write_all(&c, 0, &[0, 1]) {
        Err(Error::Sample { index, reason, .. }) => {
            assert_eq!(index, 1);
            assert!(reason.contains("label 9 is outside 0..3"), "{reason}");
        }
        other => panic!("expected sample 1's error, got {:?}", other.map(|r| r.2)),
    }
}

/// A seed whose replacements for sample `bad` of `c`'s source draw `first` before `then`.
fn seed_drawing(c: &Collator, bad: usize, first: usize, then: usize) -> u64 {
    let pick = FromSource(c.source().unwrap().as_ref());
    (0..200)
        .find(|&seed| {
            let drawn: Vec<usize> = replacements(key(seed, 0), &pick, bad).collect();
            let at = |i| drawn.iter().position(|&c| c == i);
            matches!((at(first), at(then)), (Some(a), Some(b)) if a < b)
                || (at(first).is_some() && at(then).is_none())
        })
        .expect("a seed drawing `first` before `then`")
}

#[test]
fn a_failed_write_is_replaced_by_a_candidate_that_fits_the_padded_lengths_or_the_slots_room() {
    // Sample 1's label cannot be written; sample 2 reads and writes but is longer than the
    // batch's padded length (1) under pad, and than the room sample 1 was read with (1 row)
    // under offsets; sample 0 fits. A seed whose replacements for sample 1 draw 2 before 0
    // shows that the length check is what passes 2 over.
    for (ragged, extents, expected) in [
        (Ragged::Pad(None), "tokens_lengths", vec![1, 1]),
        (Ragged::Offsets, "tokens_offsets", vec![0, 1, 2]),
    ] {
        let c = labelled_as(ragged, &[1, 1, 5], &[0, 9, 2], true);
        let seed = seed_drawing(&c, 1, 2, 0);
        let (metas, slab, skipped) = write_all(&c, seed, &[0, 1]).unwrap();
        assert_eq!(skipped, 1, "{extents}");
        assert_eq!(
            field(&metas, &slab, "tokens"),
            [0, 0],
            "{extents}: slot 1 holds sample 0"
        );
        assert_eq!(i64s(field(&metas, &slab, extents)), expected);
    }
}

#[test]
fn a_shorter_replacement_under_offsets_leaves_no_gap_before_the_next_slot() {
    // Sample 1 (3 rows) cannot be written; sample 2 (1 row) replaces it, so slot 2 starts
    // one row after slot 1's start, and the field is cut to the rows written.
    let c = labelled_as(Ragged::Offsets, &[2, 3, 1], &[0, 9, 1], true);
    let seed = seed_drawing(&c, 1, 2, 0);
    let (metas, slab, skipped) = write_all(&c, seed, &[0, 1, 2]).unwrap();
    assert_eq!(skipped, 1);
    assert_eq!(metas[0].shape, [4], "6 rows of room, 4 written");
    assert_eq!(field(&metas, &slab, "tokens"), [0, 0, 2, 2]);
    assert_eq!(i64s(field(&metas, &slab, "tokens_offsets")), [0, 2, 3, 4]);
}
