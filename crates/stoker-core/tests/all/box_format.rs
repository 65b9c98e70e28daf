//! The `box_format` option: how boxes named by `fields(boxes=NAME)` without a `:FORMAT` suffix
//! are stored and delivered; a suffix in the spec wins over it.

use std::sync::Arc;

use stoker_core::source::MemorySource;
use stoker_core::{DType, Loader, LoaderOptions, SourceSpec};

const N: usize = 6;
const S: usize = 48;

/// Sample `n`'s boxes as `cxcywh` rows: a different number per sample, some near the edges.
fn boxes(n: usize) -> Vec<[f32; 4]> {
    (0..n % 3 + 2)
        .map(|k| {
            let (cx, cy) = ((4 + 15 * k + 5 * n) % 44, (6 + 13 * k + 3 * n) % 44);
            [cx as f32, cy as f32, (6 + 3 * k) as f32, (8 + 2 * n) as f32]
        })
        .collect()
}

fn source() -> Arc<MemorySource> {
    let image: Vec<u8> = (0..N * S * S)
        .flat_map(|i| ((i % 251) as f32).to_ne_bytes())
        .collect();
    let rows = |n: usize| -> Vec<u8> {
        boxes(n)
            .iter()
            .flat_map(|b| b.iter().flat_map(|v| v.to_ne_bytes()))
            .collect()
    };
    let source = MemorySource::new()
        .with_tensor("image", DType::F32, &[1, S, S], image)
        .and_then(|s| s.with_ragged("boxes", DType::F32, &[4], (0..N).map(rows).collect()))
        .unwrap();
    Arc::new(source)
}

/// Every batch's boxes and their lengths, under options `kv`.
fn run(kv: &[(&str, &str)]) -> stoker_core::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut o = LoaderOptions::default();
    for (k, v) in [("batch_size", "3"), ("input_layout", "chw"), ("pad", "-1")]
        .iter()
        .chain(kv)
    {
        o.set(k, v)?;
    }
    let mut l = Loader::new(&o.with_source(SourceSpec::Custom(source())))?;
    let mut out = Vec::new();
    while let Some(b) = l.next()? {
        let get = |name: &str| b.field_by_name(name).unwrap().data.unwrap().to_vec();
        out.push((get("boxes"), get("boxes_lengths")));
    }
    Ok(out)
}

const OPS: &str = "center_crop(40) | hflip(p=1)";

#[test]
fn box_format_is_the_format_of_boxes_named_without_a_suffix() {
    let spec = |boxes: &str| format!("fields(image=image, boxes={boxes}) | {OPS}");
    let by_option = run(&[("transform", &spec("boxes")), ("box_format", "cxcywh")]).unwrap();
    let by_suffix = run(&[("transform", &spec("boxes:cxcywh"))]).unwrap();
    assert_eq!(by_option, by_suffix);
    // A suffix wins over the option.
    let both = run(&[("transform", &spec("boxes:cxcywh")), ("box_format", "xywh")]).unwrap();
    assert_eq!(both, by_suffix);
    // The default, xyxy, reads the same numbers as other boxes.
    let as_xyxy = run(&[("transform", &spec("boxes"))]).unwrap();
    assert_ne!(as_xyxy, by_suffix);
    // Delivered in the format stored: the first box of sample 0, (4, 6, 6, 8) centre-size, is
    // cropped by 4 on each side and mirrored in a 40-wide image: centre (40 - 0, 2) clamped.
    let first: Vec<f32> = by_option[0].0[..16]
        .chunks_exact(4)
        .map(|x| f32::from_ne_bytes([x[0], x[1], x[2], x[3]]))
        .collect();
    // xyxy (1, 2, 7, 10) -> crop (-3, -2, 3, 6) -> clamp (0, 0, 3, 6) -> flip (37, 0, 40, 6).
    assert_eq!(first, vec![38.5, 3.0, 3.0, 6.0]);
}

#[test]
fn a_box_format_that_is_not_one_is_refused_in_words() {
    let e = run(&[("box_format", "ltrb")]).unwrap_err().to_string();
    assert!(
        e.contains("box_format") && e.contains("xyxy, xywh or cxcywh"),
        "{e}"
    );
}
