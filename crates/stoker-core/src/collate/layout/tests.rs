use super::*;
use crate::source::MemorySource;

/// Fields `tokens` (ragged int32 rows of 3), `id` (int32 `[2]`) and `text` (ragged bytes).
fn mixed() -> Collator {
    let tokens = vec![vec![0u8; 12], vec![0u8; 36]];
    let text = vec![b"ab".to_vec(), b"abcde".to_vec()];
    let source = MemorySource::new()
        .with_ragged("tokens", DType::I32, &[3], tokens)
        .and_then(|s| s.with_tensor("id", DType::I32, &[2], vec![0; 16]))
        .and_then(|s| s.with_ragged("text", DType::U8, &[], text))
        .unwrap();
    Collator::new(Arc::new(source), Some(-1.0), None, false).unwrap()
}

/// Each field's name, element type and shape.
fn names_types_shapes(metas: &[FieldMeta]) -> Vec<(&str, DType, Vec<usize>)> {
    metas
        .iter()
        .map(|m| (m.name.as_str(), m.dtype, m.shape.clone()))
        .collect()
}

#[test]
fn ragged_fields_take_the_padded_length_and_add_a_lengths_field_after_the_sources() {
    let c = mixed();
    let (metas, total) = c.layout(4, &[7, 0, 11]);
    assert_eq!(
        names_types_shapes(&metas),
        [
            ("tokens", DType::I32, vec![4, 7, 3]),
            ("id", DType::I32, vec![4, 2]),
            ("text", DType::U8, vec![4, 11]),
            ("tokens_lengths", DType::I64, vec![4]),
            ("text_lengths", DType::I64, vec![4]),
        ]
    );
    // Each field on its own 256-byte boundary, past the end of the one before.
    let mut end = 0;
    for m in &metas {
        assert_eq!(m.offset % FIELD_ALIGN, 0, "{}", m.name);
        assert!(m.offset >= end, "{} overlaps the field before it", m.name);
        end = m.offset + m.num_bytes();
    }
    assert_eq!(
        metas[1].offset, 512,
        "4 * 7 * 3 int32 = 336 bytes, rounded up"
    );
    assert!(total >= end && total % FIELD_ALIGN == 0, "{total}");
}

/// [`mixed`]'s fields batched flat, with offsets.
fn mixed_flat() -> Collator {
    let c = mixed();
    let source = c.source().unwrap().clone();
    Collator::new(source, Ragged::Offsets, None, false).unwrap()
}

#[test]
fn ragged_fields_under_offsets_lie_flat_and_add_an_offsets_field_after_the_sources() {
    let c = mixed_flat();
    let (metas, total) = c.layout(4, &[7, 0, 11]);
    assert_eq!(
        names_types_shapes(&metas),
        [
            ("tokens", DType::I32, vec![7, 3]),
            ("id", DType::I32, vec![4, 2]),
            ("text", DType::U8, vec![11]),
            ("tokens_offsets", DType::I64, vec![5]),
            ("text_offsets", DType::I64, vec![5]),
        ]
    );
    let end = metas.last().map(|m| m.offset + m.num_bytes()).unwrap();
    assert!(total >= end && total % FIELD_ALIGN == 0, "{total}");
}

#[test]
fn a_flat_fields_rows_are_the_sum_of_the_samples_and_never_take_more_slab_than_padded() {
    fn sample(bytes: &[Vec<u8>]) -> Sample<'_> {
        let mut s = Sample::default();
        for (f, b) in bytes.iter().enumerate() {
            s.set(f, b);
        }
        s
    }
    let rows = [
        [vec![0u8; 12], vec![0u8; 8], b"abc".to_vec()],
        [vec![0u8; 60], vec![0u8; 8], b"a".to_vec()],
        [vec![], vec![0u8; 8], b"abcdefgh".to_vec()],
    ];
    let samples: Vec<_> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| (i, sample(r)))
        .collect();
    let (padded, flat) = (mixed(), mixed_flat());
    assert_eq!(padded.extents(&samples), vec![5, 0, 8]);
    assert_eq!(flat.extents(&samples), vec![6, 0, 12]);
    let padded_bytes = padded.layout(3, &padded.extents(&samples)).1;
    let flat_bytes = flat.layout(3, &flat.extents(&samples)).1;
    assert!(flat_bytes <= padded_bytes, "{flat_bytes} > {padded_bytes}");
    // The bound the memory budget plans with holds for both.
    assert!(flat.batch_bytes(3) <= flat_bytes);
}

#[test]
fn the_padded_length_is_the_longest_samples_in_rows_of_the_inner_shape() {
    let c = mixed();
    fn sample(bytes: &[Vec<u8>]) -> Sample<'_> {
        let mut s = Sample::default();
        for (f, b) in bytes.iter().enumerate() {
            s.set(f, b);
        }
        s
    }
    let short = [vec![0u8; 12], vec![0u8; 8], b"abc".to_vec()];
    let long = [vec![0u8; 60], vec![0u8; 8], b"a".to_vec()];
    let samples = [(0, sample(&short)), (1, sample(&long))];
    assert_eq!(
        c.ragged_len(0, &samples[1].1),
        5,
        "60 bytes of int32 rows of 3"
    );
    assert_eq!(
        c.ragged_len(1, &samples[1].1),
        0,
        "a fixed field is not ragged"
    );
    assert_eq!(c.extents(&samples), vec![5, 0, 3]);
    assert_eq!(c.extents(&[]), vec![0, 0, 0]);
}

#[test]
fn the_slab_size_counts_ragged_fields_empty_and_is_never_zero() {
    let c = mixed();
    // Two int32 per sample is the only field with bytes; the rest start on boundaries.
    assert_eq!(c.batch_bytes(4), 3 * FIELD_ALIGN);
    assert!(c.batch_bytes(4) <= c.layout(4, &[1, 0, 1]).1);
    // An empty batch still takes a (one-byte) slab.
    assert_eq!(c.layout(0, &[0, 0, 0]).1, 1);
}

#[test]
fn a_ragged_field_needs_a_pad_value_unless_it_is_raw_bytes() {
    let floats = FieldSpec::ragged("boxes", DType::F32, &[4]);
    let e = Output::for_field(&floats, Ragged::Pad(None), None, None)
        .err()
        .expect("no pad for float32 rows")
        .to_string();
    assert!(e.contains("pad") && e.contains("field `boxes`"), "{e}");
    match Output::for_field(&floats, Ragged::Pad(Some(-1.5)), None, None).unwrap() {
        Output::Ragged { pad, inner, .. } => {
            assert_eq!(pad, Some((-1.5f32).to_ne_bytes().to_vec()));
            assert_eq!(inner, [4]);
        }
        _ => panic!("a ragged field is padded"),
    }
    let text = FieldSpec::ragged("text", DType::U8, &[]);
    match Output::for_field(&text, Ragged::Pad(None), None, None).unwrap() {
        Output::Ragged { pad, .. } => assert_eq!(pad, Some(vec![0])),
        _ => panic!("a ragged field is padded"),
    }
}

#[test]
fn under_offsets_a_ragged_field_needs_no_pad_value_and_is_flat() {
    let floats = FieldSpec::ragged("boxes", DType::F32, &[4]);
    match Output::for_field(&floats, Ragged::Offsets, None, None).unwrap() {
        Output::Ragged { pad, inner, dtype } => {
            assert_eq!((pad, inner, dtype), (None, vec![4], DType::F32));
        }
        _ => panic!("a ragged field stays ragged"),
    }
}

#[test]
fn an_encoded_image_field_needs_image_stages_with_a_sized_pipeline() {
    let spec = FieldSpec::encoded_image("jpg");
    let e = Output::for_field(&spec, Ragged::Pad(None), None, None)
        .err()
        .unwrap();
    assert!(
        matches!(e, Error::Unsupported(ref m) if m.contains("field `jpg`")),
        "{e}"
    );
    let unsized_stages = Arc::new(ImageStages {
        max_pixels: 1 << 20,
        jpeg_decoder: crate::decode::JpegDecoder::Auto,
        input_layout: None,
        pipeline: None,
        transform: Some("hflip".into()),
        dtype: None,
        layout: crate::dtype::Layout::Nhwc,
        roles: None,
    });
    let e = Output::for_field(&spec, Ragged::Pad(None), Some(&unsized_stages), None)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("transform") && e.contains("field `jpg`"), "{e}");
}
