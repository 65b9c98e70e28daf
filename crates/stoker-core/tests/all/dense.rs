//! Dense tensors through the loader: image-shaped tensors of any channel count and of uint8,
//! uint16, float16, bfloat16 or float32 (`input_layout` says where the channels are when the shape
//! cannot), and segmentation masks and bounding boxes named by `fields(...)` that take every
//! geometric op with their image's draw.

use std::path::Path;
use std::sync::Arc;

use stoker_core::source::{write_npy, FieldSpec, MemorySource, Sample, Source};
use stoker_core::{Batch, DType, Loader, LoaderOptions, SourceSpec};

use crate::support::files::tmp;

const N: usize = 8;
const S: usize = 64;
const C: usize = 13;
const B: usize = 4;

/// `[N, S, S, C]` uint8 with values that differ by pixel, channel and sample.
fn hwc() -> Vec<u8> {
    (0..N * S * S * C)
        .map(|i| {
            let (px, c) = (i / C, i % C);
            let (n, y, x) = (px / (S * S), px / S % S, px % S);
            ((x * 3 + y * 5 + c * 17 + n * 29 + (x ^ y) % 11) % 256) as u8
        })
        .collect()
}

fn npy(dir: &Path, name: &str, dtype: DType, shape: &[usize], data: &[u8]) -> String {
    let path = dir.join(name);
    write_npy(&path, dtype, shape, data).unwrap();
    format!("npy:{}", path.display())
}

fn options(kv: &[(&str, &str)]) -> stoker_core::Result<LoaderOptions> {
    let mut o = LoaderOptions::new();
    o.set("batch_size", &B.to_string())?;
    o.set("seed", "11")?;
    o.set("shuffle", "true")?;
    for (k, v) in kv {
        o.set(k, v)?;
    }
    Ok(o)
}

fn loader(kv: &[(&str, &str)]) -> stoker_core::Result<Loader> {
    Loader::new(&options(kv)?)
}

/// Every batch of the first epoch: field `name`'s dtype, shape and bytes.
fn epoch(l: &mut Loader, name: &str) -> Vec<(DType, Vec<usize>, Vec<u8>)> {
    let mut out = Vec::new();
    while let Some(b) = l.next().expect("no error") {
        let f = b.field_by_name(name).expect("the field");
        out.push((f.dtype, f.shape.to_vec(), f.data.expect("host").to_vec()));
    }
    out
}

const SPEC: &str = "random_resized_crop(32) | hflip";

#[test]
fn a_13_channel_uint8_array_gives_each_channel_as_the_rgb_path_gives_it() {
    let dir = tmp("dense_u8");
    let data = hwc();
    let source = npy(&dir, "bands.npy", DType::U8, &[N, S, S, C], &data);
    let got = epoch(
        &mut loader(&[
            ("source", &source),
            ("transform", SPEC),
            ("input_layout", "hwc"),
            ("num_workers", "2"),
        ])
        .unwrap(),
        "data",
    );
    assert_eq!(got.len(), N / B);
    for (dtype, shape, _) in &got {
        assert_eq!((*dtype, shape.clone()), (DType::U8, vec![B, C, 32, 32]));
    }
    // Reference: channels 3g..3g+3 as an RGB array through the same loader options.
    for g in 0..C.div_ceil(3) {
        let ch = |k: usize| (3 * g + k).min(C - 1);
        let rgb: Vec<u8> = data
            .chunks_exact(C)
            .flat_map(|p| [p[ch(0)], p[ch(1)], p[ch(2)]])
            .collect();
        let source = npy(&dir, &format!("rgb{g}.npy"), DType::U8, &[N, S, S, 3], &rgb);
        let want = epoch(
            &mut loader(&[("source", &source), ("transform", SPEC)]).unwrap(),
            "data",
        );
        let plane = 32 * 32;
        for ((_, _, got), (_, shape, want)) in got.iter().zip(&want) {
            assert_eq!(shape, &vec![B, 3, 32, 32]);
            for b in 0..B {
                for k in 0..3 {
                    let c = 3 * g + k;
                    if c >= C {
                        continue;
                    }
                    assert_eq!(
                        &got[(b * C + c) * plane..][..plane],
                        &want[(b * 3 + k) * plane..][..plane],
                        "sample {b}, channel {c}"
                    );
                }
            }
        }
    }
}

#[test]
fn a_float32_channels_first_array_needs_input_layout_and_stays_float() {
    let dir = tmp("dense_f32");
    let data = hwc();
    // The same values as float32 [N, C, S, S], plus a quarter a uint8 round trip would lose.
    let mut chw = vec![0f32; data.len()];
    for (i, &v) in data.iter().enumerate() {
        let (px, c) = (i / C, i % C);
        let (n, p) = (px / (S * S), px % (S * S));
        chw[(n * C + c) * S * S + p] = v as f32 + 0.25;
    }
    let bytes: Vec<u8> = chw.iter().flat_map(|v| v.to_ne_bytes()).collect();
    let source = npy(&dir, "bands.npy", DType::F32, &[N, C, S, S], &bytes);
    // 13 first and 64 last: the shape cannot say which holds the channels.
    let e = loader(&[("source", &source), ("transform", SPEC)])
        .expect_err("refused")
        .to_string();
    assert!(e.contains("input_layout") && e.contains("transform"), "{e}");

    let mut l = loader(&[
        ("source", &source),
        ("transform", SPEC),
        ("input_layout", "chw"),
    ])
    .unwrap();
    let float = epoch(&mut l, "data");
    let u8_source = npy(&dir, "bands_u8.npy", DType::U8, &[N, S, S, C], &data);
    let bytes = epoch(
        &mut loader(&[
            ("source", &u8_source),
            ("transform", SPEC),
            ("input_layout", "hwc"),
        ])
        .unwrap(),
        "data",
    );
    for ((dtype, shape, f), (_, _, u)) in float.iter().zip(&bytes) {
        assert_eq!((*dtype, shape.clone()), (DType::F32, vec![B, C, 32, 32]));
        let f: Vec<f32> = f
            .chunks_exact(4)
            .map(|b| f32::from_ne_bytes(b.try_into().unwrap()))
            .collect();
        let mut fractional = 0;
        for (f, &u) in f.iter().zip(u) {
            assert!((f - 0.25 - u as f32).abs() <= 1.0, "{f} vs {u}");
            fractional += usize::from((f - f.round()).abs() > 0.01);
        }
        assert!(
            fractional > f.len() / 2,
            "resampled in float, not through uint8"
        );
    }
}

#[test]
fn dense_batches_are_the_same_whatever_num_workers() {
    let dir = tmp("dense_workers");
    let source = npy(&dir, "bands.npy", DType::U8, &[N, S, S, C], &hwc());
    let spec = "random_resized_crop(24) | hflip | vflip | rotate(20) | normalize(mean=0.5, std=0.25) | random_erasing(p=0.5)";
    let run = |workers: &str| {
        epoch(
            &mut loader(&[
                ("source", &source),
                ("transform", spec),
                ("input_layout", "hwc"),
                ("num_workers", workers),
                ("dtype", "bfloat16"),
                ("layout", "nhwc"),
            ])
            .unwrap(),
            "data",
        )
    };
    let zero = run("0");
    assert_eq!(zero[0].0, DType::BF16);
    assert_eq!(zero[0].1, vec![B, 24, 24, C]);
    assert_eq!(zero, run("3"));
}

#[test]
fn a_uint16_array_is_resampled_as_float32_rounded_once_whatever_num_workers() {
    let dir = tmp("dense_u16");
    // [N, S, S, 4] uint16 over the whole 16-bit range (4 channels: the shape says hwc).
    const C4: usize = 4;
    let values: Vec<u16> = (0..N * S * S * C4)
        .map(|i| {
            let (px, c) = (i / C4, i % C4);
            let (n, y, x) = (px / (S * S), px / S % S, px % S);
            ((x * 1031 + y * 613 + c * 9973 + n * 3001 + (x ^ y) % 11 * 97) % 65536) as u16
        })
        .collect();
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
    let source = npy(&dir, "u16.npy", DType::U16, &[N, S, S, C4], &bytes);
    let floats: Vec<u8> = values
        .iter()
        .flat_map(|&v| f32::from(v).to_ne_bytes())
        .collect();
    let f32_source = npy(&dir, "f32.npy", DType::F32, &[N, S, S, C4], &floats);
    let run = |source: &str, workers: &str| {
        epoch(
            &mut loader(&[
                ("source", source),
                ("transform", SPEC),
                ("num_workers", workers),
            ])
            .unwrap(),
            "data",
        )
    };
    let zero = run(&source, "0");
    assert_eq!(zero.len(), N / B);
    assert_eq!(zero, run(&source, "3"), "the same whatever num_workers");
    let float = run(&f32_source, "2");
    for ((dtype, shape, got), (fdtype, _, want)) in zero.iter().zip(&float) {
        assert_eq!((*dtype, shape.clone()), (DType::U16, vec![B, C4, 32, 32]));
        assert_eq!(*fdtype, DType::F32);
        let got: Vec<u16> = got
            .chunks_exact(2)
            .map(|b| u16::from_ne_bytes([b[0], b[1]]))
            .collect();
        let want: Vec<u16> = want
            .chunks_exact(4)
            .map(|b| {
                let v = f32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
                // Round half to even, as the pipeline does (ties are rare in a blend).
                let r = v.round();
                let r = if (v - v.trunc()).abs() == 0.5 && r % 2.0 != 0.0 {
                    r - 1.0
                } else {
                    r
                };
                r.clamp(0.0, 65535.0) as u16
            })
            .collect();
        assert_eq!(got, want);
        assert!(
            got.iter().filter(|&&v| v > 255).count() > got.len() / 2,
            "values above 255 survive"
        );
    }
    // A float output needs no dtype beyond normalize; uint8 is refused with the reason.
    let e = loader(&[("source", &source), ("transform", SPEC), ("dtype", "uint8")])
        .expect_err("refused")
        .to_string();
    assert!(e.contains("uint16") && e.contains("not narrowed"), "{e}");
}

#[test]
fn a_colour_op_on_a_multispectral_image_fails_at_creation_naming_the_field() {
    let dir = tmp("dense_colour");
    let source = npy(&dir, "bands.npy", DType::U8, &[N, S, S, C], &hwc());
    let e = loader(&[
        ("source", &source),
        (
            "transform",
            "random_resized_crop(32) | color_jitter(brightness=0.4)",
        ),
        ("input_layout", "hwc"),
    ])
    .expect_err("refused")
    .to_string();
    assert!(
        e.contains("field `data`")
            && e.contains("color_jitter")
            && e.contains("needs an RGB image")
            && e.contains("13-channel uint8"),
        "{e}"
    );
}

/// A source of `image` (float32 `[2, S, S]`: x and y of each pixel, channels first) and
/// `mask` (int32 `[S, S]`: label `y * S + x`), so each output pixel says where it came from.
fn coordinates() -> Arc<MemorySource> {
    let mut image = Vec::new();
    let mut mask = Vec::new();
    for _ in 0..N {
        for c in 0..2 {
            for y in 0..S {
                for x in 0..S {
                    let v = if c == 0 { x } else { y } as f32;
                    image.extend_from_slice(&v.to_ne_bytes());
                }
            }
        }
        for i in 0..(S * S) as i32 {
            mask.extend_from_slice(&i.to_ne_bytes());
        }
    }
    let source = MemorySource::new()
        .with_tensor("image", DType::F32, &[2, S, S], image)
        .and_then(|s| s.with_tensor("mask", DType::I32, &[S, S], mask))
        .unwrap();
    Arc::new(source)
}

fn memory_loader(source: Arc<MemorySource>, kv: &[(&str, &str)]) -> stoker_core::Result<Loader> {
    let o = options(kv)?.with_source(SourceSpec::Custom(source));
    Loader::new(&o)
}

#[test]
fn a_mask_takes_its_images_draw_and_keeps_its_labels() {
    let spec = "fields(image=image, mask=mask, ignore_index=-1) | random_resized_crop(24, 28) \
                | hflip | random_crop(24, padding=3) | vflip | normalize(mean=0, std=1)";
    for workers in ["0", "3"] {
        let mut l = memory_loader(
            coordinates(),
            &[
                ("transform", spec),
                ("num_workers", workers),
                ("input_layout", "chw"),
            ],
        )
        .unwrap();
        let mut padded = 0;
        while let Some(b) = l.next().unwrap() {
            let img = b.field_by_name("image").unwrap();
            let mask = b.field_by_name("mask").unwrap();
            assert_eq!(
                (img.dtype, img.shape.to_vec()),
                (DType::F32, vec![B, 2, 24, 24])
            );
            assert_eq!(
                (mask.dtype, mask.shape.to_vec()),
                (DType::I32, vec![B, 24, 24])
            );
            let img: Vec<f32> = img
                .data
                .unwrap()
                .chunks_exact(4)
                .map(|b| f32::from_ne_bytes(b.try_into().unwrap()))
                .collect();
            let labels: Vec<i32> = mask
                .data
                .unwrap()
                .chunks_exact(4)
                .map(|b| i32::from_ne_bytes(b.try_into().unwrap()))
                .collect();
            let plane = 24 * 24;
            for s in 0..B {
                for i in 0..plane {
                    let label = labels[s * plane + i];
                    let (fx, fy) = (img[(s * 2) * plane + i], img[(s * 2 + 1) * plane + i]);
                    if label == -1 {
                        // Padding in both: the image's fill is 0.
                        assert_eq!((fx, fy), (0.0, 0.0));
                        padded += 1;
                        continue;
                    }
                    assert!((0..(S * S) as i32).contains(&label), "a label of the input");
                    let (mx, my) = ((label as usize % S) as f32, (label as usize / S) as f32);
                    // The filter's sample point and the nearest pixel's are within the crop's
                    // scale of each other (at most 64/24 px) plus a pixel; a mismatched flip
                    // or crop would put them tens of pixels apart.
                    assert!((fx - mx).abs() <= 4.0, "x {fx} vs {mx}");
                    assert!((fy - my).abs() <= 4.0, "y {fy} vs {my}");
                }
            }
        }
        assert!(padded > 0, "random_crop's padding reached the mask");
    }
}

#[test]
fn roles_are_checked_against_the_source() {
    for (spec, needle) in [
        ("fields(image=image, mask=nope) | hflip", "no field `nope`"),
        ("fields(image=nope, mask=mask) | hflip", "no field `nope`"),
        ("fields(image=image) | hflip", "names no mask"),
        (
            "fields(image=image, keypoints=mask) | hflip",
            "keypoints are float32 rows of 2",
        ),
        (
            "fields(image=image, boxes=mask) | hflip",
            "boxes are float32 rows of 4",
        ),
        ("hflip | fields(image=image, mask=mask)", "must come first"),
        (
            "fields(image=image, mask=mask) | random_iou_crop | resize(8, 8)",
            "random_iou_crop draws its crop from each sample's boxes",
        ),
        ("fields(mask=mask) | rand_augment", "a colour op"),
        (
            "fields(image=image, mask=mask, per_box=mask) | hflip",
            "per_box= is about boxes: give boxes= too",
        ),
        (
            "fields(image=image, mask=mask, min_area=2) | hflip",
            "min_area= is about boxes",
        ),
        (
            "fields(image=image, boxes=mask, min_size=-1) | hflip",
            "min_size=`-1` is not a number of pixels",
        ),
        (
            "fields(image=image, boxes=mask, per_box=image) | hflip",
            "each role needs a field of its own",
        ),
    ] {
        let e = memory_loader(
            coordinates(),
            &[("transform", spec), ("input_layout", "chw")],
        )
        .expect_err("refused")
        .to_string();
        assert!(e.contains(needle), "{spec}: {e}");
    }
    // A mask of another size than its image.
    let source = MemorySource::new()
        .with_tensor("image", DType::U8, &[S, S, 3], vec![0; N * S * S * 3])
        .and_then(|s| s.with_tensor("mask", DType::U8, &[S / 2, S / 2], vec![0; N * S * S / 4]))
        .unwrap();
    let e = memory_loader(
        Arc::new(source),
        &[("transform", "fields(image=image, mask=mask) | hflip")],
    )
    .expect_err("refused")
    .to_string();
    assert!(
        e.contains("the mask is 32x32") && e.contains("64x64"),
        "{e}"
    );
}

#[test]
fn an_rgb_uint8_image_and_its_mask_share_the_draw() {
    // RGB uint8 goes through the RGB8 pipeline, the mask through the dense one: the draws
    // still agree. Red holds x, green y (S = 64 fits a byte); the mask the label y * S + x.
    let mut image = Vec::new();
    let mut mask = Vec::new();
    for _ in 0..N {
        for y in 0..S {
            for x in 0..S {
                image.extend_from_slice(&[x as u8, y as u8, 0]);
                mask.extend_from_slice(&((y * S + x) as i32).to_ne_bytes());
            }
        }
    }
    let source = MemorySource::new()
        .with_tensor("image", DType::U8, &[S, S, 3], image)
        .and_then(|s| s.with_tensor("mask", DType::I32, &[S, S], mask))
        .unwrap();
    let source = Arc::new(source);
    // The AutoAugment family would shear or rotate the image alone.
    let e = memory_loader(
        source.clone(),
        &[(
            "transform",
            "fields(mask=mask) | center_crop(32) | trivial_augment",
        )],
    )
    .expect_err("refused")
    .to_string();
    assert!(
        e.contains("field `mask`") && e.contains("not supported with a mask"),
        "{e}"
    );
    // The issue's spec: an RGB image's normalize(imagenet) and fills are the image's alone.
    let issue = "fields(image=image, mask=mask) | random_resized_crop(32) | hflip | \
                 rotate(10, fill=1,2,3) | normalize(imagenet)";
    let mut l = memory_loader(source.clone(), &[("transform", issue)]).unwrap();
    let b = l.next().unwrap().unwrap();
    let (img, mask) = (
        b.field_by_name("image").unwrap(),
        b.field_by_name("mask").unwrap(),
    );
    assert_eq!(
        (img.dtype, img.shape.to_vec()),
        (DType::F32, vec![B, 3, 32, 32])
    );
    assert_eq!(
        (mask.dtype, mask.shape.to_vec()),
        (DType::I32, vec![B, 32, 32])
    );
    let spec = "fields(mask=mask) | random_resized_crop(20) | hflip | affine(degrees=15) \
                | color_jitter(brightness=0.3) | vflip";
    let mut l = memory_loader(source, &[("transform", spec)]).unwrap();
    let b = l.next().unwrap().unwrap();
    let img = b.field_by_name("image").unwrap().data.unwrap().to_vec();
    let labels: Vec<i32> = b
        .field_by_name("mask")
        .unwrap()
        .data
        .unwrap()
        .chunks_exact(4)
        .map(|b| i32::from_ne_bytes(b.try_into().unwrap()))
        .collect();
    let plane = 20 * 20;
    let mut compared = 0;
    for s in 0..B {
        for i in 0..plane {
            let label = labels[s * plane + i];
            if label == 255 {
                continue;
            }
            // Brightness scales x and y alike; the rotation's bilinear blend and the
            // brightness keep them near the labelled pixel's unless a draw differed.
            let (r, g) = (
                img[(s * 3) * plane + i] as f32,
                img[(s * 3 + 1) * plane + i] as f32,
            );
            let (mx, my) = ((label as usize % S) as f32, (label as usize / S) as f32);
            let k = if mx + my > 0.0 {
                (r + g) / (mx + my)
            } else {
                1.0
            };
            if (0.5..2.0).contains(&k) && r > 4.0 && g > 4.0 {
                assert!(
                    (r / k - mx).abs() <= 5.0 && (g / k - my).abs() <= 5.0,
                    "{r},{g} vs {mx},{my}"
                );
                compared += 1;
            }
        }
    }
    assert!(compared > plane, "{compared}");
}

/// Boxes of each sample: `(box, label)` pairs, a different number per sample, label `100 * n + k`.
fn sample_boxes(n: usize) -> Vec<([f32; 4], i64)> {
    (0..n % 4 + 2)
        .map(|k| {
            let (x, y) = ((5 + 13 * k + 3 * n) % 40, (7 + 11 * k + 5 * n) % 36);
            let b = [x as f32, y as f32, (x + 12 + k) as f32, (y + 20) as f32];
            (b, (100 * n + k) as i64)
        })
        .collect()
}

#[test]
fn boxes_take_their_images_draw_and_drop_with_their_labels() {
    let mut image = Vec::new();
    for _ in 0..N {
        for c in 0..2 {
            for y in 0..S {
                for x in 0..S {
                    let v = if c == 0 { x } else { y } as f32;
                    image.extend_from_slice(&v.to_ne_bytes());
                }
            }
        }
    }
    let rows = |n: usize| -> Vec<u8> {
        sample_boxes(n)
            .iter()
            .flat_map(|(b, _)| b.iter().flat_map(|v| v.to_ne_bytes()))
            .collect()
    };
    let labels = |n: usize| -> Vec<u8> {
        sample_boxes(n)
            .iter()
            .flat_map(|(_, l)| l.to_ne_bytes())
            .collect()
    };
    let source = MemorySource::new()
        .with_tensor("image", DType::F32, &[2, S, S], image)
        .and_then(|s| s.with_ragged("boxes", DType::F32, &[4], (0..N).map(rows).collect()))
        .and_then(|s| s.with_ragged("labels", DType::I64, &[], (0..N).map(labels).collect()))
        .unwrap();
    let source = Arc::new(source);
    let spec = "fields(image=image, boxes=boxes, labels=labels) \
                | random_resized_crop(32, scale=0.2:1) | hflip | vflip";
    let run = |workers: &str| {
        let mut l = memory_loader(
            source.clone(),
            &[
                ("transform", spec),
                ("input_layout", "chw"),
                ("pad", "-1"),
                ("num_workers", workers),
            ],
        )
        .unwrap();
        let mut out = Vec::new();
        while let Some(b) = l.next().unwrap() {
            let get = |name: &str| b.field_by_name(name).unwrap().data.unwrap().to_vec();
            let shape = b.field_by_name("boxes").unwrap().shape.to_vec();
            out.push((
                get("image"),
                get("boxes"),
                get("labels"),
                get("boxes_lengths"),
                get("labels_lengths"),
                shape,
            ));
        }
        out
    };
    let batches = run("0");
    assert_eq!(batches, run("3"), "the same whatever num_workers");
    let (mut kept, mut dropped) = (0, 0);
    for (image, boxes, labels, boxes_len, labels_len, shape) in &batches {
        assert_eq!(boxes_len, labels_len, "labels are dropped with their boxes");
        let f32s = |b: &[u8]| -> Vec<f32> {
            b.chunks_exact(4)
                .map(|x| f32::from_ne_bytes(x.try_into().unwrap()))
                .collect()
        };
        let i64s = |b: &[u8]| -> Vec<i64> {
            b.chunks_exact(8)
                .map(|x| i64::from_ne_bytes(x.try_into().unwrap()))
                .collect()
        };
        let (image, boxes, labels, lens) =
            (f32s(image), f32s(boxes), i64s(labels), i64s(boxes_len));
        let rows = shape[1];
        for s in 0..B {
            let len = lens[s] as usize;
            let n = labels[s * rows] as usize / 100;
            let source_boxes = sample_boxes(n);
            dropped += source_boxes.len() - len;
            for k in 0..rows {
                let b = &boxes[(s * rows + k) * 4..][..4];
                let label = labels[s * rows + k];
                if k >= len {
                    assert_eq!((b, label), (&[-1.0f32; 4][..], -1), "padding");
                    continue;
                }
                kept += 1;
                let (src, _) = source_boxes
                    .iter()
                    .find(|(_, l)| *l == label)
                    .expect("a label of the sample");
                assert!(
                    b[0] >= 0.0 && b[1] >= 0.0 && b[2] <= 32.0 && b[3] <= 32.0,
                    "{b:?}"
                );
                assert!(b[2] - b[0] >= 1.0 && b[3] - b[1] >= 1.0, "{b:?}");
                // The image pixel at the box's centre came from inside the source box.
                let (cx, cy) = (
                    ((b[0] + b[2]) / 2.0) as usize,
                    ((b[1] + b[3]) / 2.0) as usize,
                );
                let at = cy.min(31) * 32 + cx.min(31);
                let (fx, fy) = (image[(s * 2) * 1024 + at], image[(s * 2 + 1) * 1024 + at]);
                let slack = 3.0;
                assert!(
                    fx >= src[0] - slack && fx <= src[2] + slack,
                    "x {fx} outside {src:?} (box {b:?})"
                );
                assert!(
                    fy >= src[1] - slack && fy <= src[3] + slack,
                    "y {fy} outside {src:?} (box {b:?})"
                );
            }
        }
    }
    assert!(kept > 0 && dropped > 0, "kept {kept}, dropped {dropped}");
}

/// `inner`, whose sample `at` reads with its boxes cut short of a whole row (it does not
/// validate).
struct ShortBoxes {
    inner: Arc<MemorySource>,
    at: Option<usize>,
}

impl Source for ShortBoxes {
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn fields(&self) -> &[FieldSpec] {
        self.inner.fields()
    }
    fn describe(&self, i: usize) -> String {
        self.inner.describe(i)
    }
    fn read<'a>(&'a self, i: usize, scratch: &'a mut Vec<u8>) -> stoker_core::Result<Sample<'a>> {
        let mut sample = self.inner.read(i, scratch)?;
        if self.at == Some(i) {
            let boxes = sample.get(1);
            sample.set(1, &boxes[..boxes.len() - 4]);
        }
        Ok(sample)
    }
}

/// The image of [`boxes_take_their_images_draw_and_drop_with_their_labels`] with the boxes and
/// labels of [`sample_boxes`]; sample `bad_rows` has a box cut short (it does not read), sample
/// `bad_labels` one label too few (its boxes cannot be moved).
fn boxes_source(bad_rows: Option<usize>, bad_labels: Option<usize>) -> Arc<dyn Source> {
    let mut image = Vec::new();
    for _ in 0..N {
        for c in 0..2 {
            for y in 0..S {
                for x in 0..S {
                    let v = if c == 0 { x } else { y } as f32;
                    image.extend_from_slice(&v.to_ne_bytes());
                }
            }
        }
    }
    let rows = |n: usize| -> Vec<u8> {
        sample_boxes(n)
            .iter()
            .flat_map(|(b, _)| b.iter().flat_map(|v| v.to_ne_bytes()))
            .collect()
    };
    let labels = |n: usize| -> Vec<u8> {
        let mut labels: Vec<u8> = sample_boxes(n)
            .iter()
            .flat_map(|(_, l)| l.to_ne_bytes())
            .collect();
        if bad_labels == Some(n) {
            labels.truncate(labels.len() - 8);
        }
        labels
    };
    let source = MemorySource::new()
        .with_tensor("image", DType::F32, &[2, S, S], image)
        .and_then(|s| s.with_ragged("boxes", DType::F32, &[4], (0..N).map(rows).collect()))
        .and_then(|s| s.with_ragged("labels", DType::I64, &[], (0..N).map(labels).collect()))
        .unwrap();
    Arc::new(ShortBoxes {
        inner: Arc::new(source),
        at: bad_rows,
    })
}

/// One sample's boxes and their labels, as delivered.
type SampleBoxes = (Vec<[f32; 4]>, Vec<i64>);

/// Each sample's boxes and labels in `b`, from the padded form (`<name>_lengths`) or the flat
/// one (`<name>_offsets`), checking the flat form's offsets on the way.
fn boxes_by_sample(b: &Batch, flat: bool) -> Vec<SampleBoxes> {
    let bytes = |name: &str| b.field_by_name(name).unwrap().data.unwrap().to_vec();
    let i64s = |name: &str| -> Vec<i64> {
        bytes(name)
            .chunks_exact(8)
            .map(|x| i64::from_ne_bytes(x.try_into().unwrap()))
            .collect()
    };
    let boxes: Vec<[f32; 4]> = bytes("boxes")
        .chunks_exact(16)
        .map(|r| {
            let mut v = [0f32; 4];
            for (v, x) in v.iter_mut().zip(r.chunks_exact(4)) {
                *v = f32::from_ne_bytes(x.try_into().unwrap());
            }
            v
        })
        .collect();
    let labels = i64s("labels");
    let shape = b.field_by_name("boxes").unwrap().shape.to_vec();
    if !flat {
        let rows = shape[1];
        let lens = i64s("boxes_lengths");
        assert_eq!(lens, i64s("labels_lengths"));
        assert!(b.field_by_name("boxes_offsets").is_none());
        return (0..b.len())
            .map(|s| {
                let len = lens[s] as usize;
                (
                    boxes[s * rows..][..len].to_vec(),
                    labels[s * rows..][..len].to_vec(),
                )
            })
            .collect();
    }
    let offsets = i64s("boxes_offsets");
    assert!(b.field_by_name("boxes_lengths").is_none());
    assert_eq!(
        offsets,
        i64s("labels_offsets"),
        "labels go with their boxes"
    );
    assert_eq!(offsets.len(), b.len() + 1);
    assert_eq!(offsets[0], 0);
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]), "{offsets:?}");
    let total = offsets[b.len()] as usize;
    assert_eq!(shape, [total, 4], "no padding: the rows are the samples'");
    assert_eq!(b.field_by_name("labels").unwrap().shape.to_vec(), [total]);
    offsets
        .windows(2)
        .map(|w| {
            let (a, z) = (w[0] as usize, w[1] as usize);
            (boxes[a..z].to_vec(), labels[a..z].to_vec())
        })
        .collect()
}

/// Every batch of an epoch of `source` under `ragged` (the boxes moving with the image's
/// draw): each sample's boxes and labels, and how many samples each batch replaced.
fn boxes_epoch(
    source: &Arc<dyn Source>,
    ragged: &str,
    kv: &[(&str, &str)],
) -> Vec<(Vec<SampleBoxes>, usize)> {
    let spec = "fields(image=image, boxes=boxes, labels=labels) \
                | random_resized_crop(32, scale=0.2:1) | hflip | vflip";
    let mut kv = kv.to_vec();
    kv.extend([
        ("transform", spec),
        ("input_layout", "chw"),
        ("pad", "-1"),
        ("ragged", ragged),
    ]);
    let o = options(&kv)
        .unwrap()
        .with_source(SourceSpec::Custom(source.clone()));
    let mut l = Loader::new(&o).unwrap();
    let mut out = Vec::new();
    while let Some(b) = l.next().unwrap() {
        out.push((boxes_by_sample(&b, ragged == "offsets"), b.skipped()));
    }
    out
}

#[test]
fn boxes_under_offsets_are_the_padded_boxes_laid_end_to_end() {
    let source = boxes_source(None, None);
    let padded = boxes_epoch(&source, "pad", &[]);
    let mut dropped = 0;
    for workers in ["0", "3"] {
        let flat = boxes_epoch(&source, "offsets", &[("num_workers", workers)]);
        assert_eq!(flat, padded, "num_workers={workers}");
    }
    for (samples, _) in &padded {
        for (boxes, labels) in samples {
            assert_eq!(boxes.len(), labels.len());
            let n = labels.first().map_or(0, |l| *l as usize / 100);
            dropped += sample_boxes(n).len() - labels.len();
        }
    }
    // The draws dropped boxes: the flat rows are fewer than the rows read.
    assert!(dropped > 0, "no box was dropped");
}

#[test]
fn under_offsets_a_replaced_sample_keeps_the_offsets_consistent() {
    // Sample 2 does not read (phase 1 replaces it); sample 5's labels do not match its boxes
    // (phase 2 replaces it, with a candidate that fits the rows left).
    let source = boxes_source(Some(2), Some(5));
    let skip = [("on_error", "skip")];
    let flat = boxes_epoch(&source, "offsets", &skip);
    let padded = boxes_epoch(&source, "pad", &skip);
    assert_eq!(flat.len(), padded.len());
    let skipped: usize = flat.iter().map(|(_, s)| s).sum();
    assert_eq!(skipped, padded.iter().map(|(_, s)| s).sum::<usize>());
    assert_eq!(skipped, 2, "both bad samples were replaced");
    let mut same = 0;
    for ((f, _), (p, _)) in flat.iter().zip(&padded) {
        for (fs, ps) in f.iter().zip(p) {
            let (boxes, labels) = fs;
            assert_eq!(boxes.len(), labels.len());
            // Every slot holds one good sample's boxes (its labels name it).
            let ns: Vec<usize> = labels.iter().map(|l| *l as usize / 100).collect();
            assert!(ns.windows(2).all(|w| w[0] == w[1]), "{ns:?}");
            assert!(ns.first().is_none_or(|n| ![2, 5].contains(n)), "{ns:?}");
            // A replacement made while writing may differ between the layouts (a padded slot
            // has more room); every other slot is the same.
            same += usize::from(fs == ps);
        }
    }
    assert!(same + 1 >= N, "{same} of {N} slots the same");
}

/// Rows of ragged field `name` of each sample of `b`: `row` bytes each, from the padded form
/// (`<name>_lengths`) or the flat one (`<name>_offsets`).
fn rows_by_sample(b: &Batch, name: &str, row: usize, flat: bool) -> Vec<Vec<Vec<u8>>> {
    let field = b.field_by_name(name).unwrap();
    let data = field.data.unwrap().to_vec();
    let i64s = |name: &str| -> Vec<i64> {
        b.field_by_name(name)
            .unwrap()
            .data
            .unwrap()
            .chunks_exact(8)
            .map(|x| i64::from_ne_bytes(x.try_into().unwrap()))
            .collect()
    };
    let spans: Vec<(usize, usize)> = if flat {
        let offsets = i64s(&format!("{name}_offsets"));
        offsets
            .windows(2)
            .map(|w| (w[0] as usize, w[1] as usize))
            .collect()
    } else {
        let rows = field.shape[1];
        let lens = i64s(&format!("{name}_lengths"));
        (0..b.len())
            .map(|s| (s * rows, s * rows + lens[s] as usize))
            .collect()
    };
    spans
        .into_iter()
        .map(|(a, z)| {
            (a..z)
                .map(|r| data[r * row..(r + 1) * row].to_vec())
                .collect()
        })
        .collect()
}

#[test]
fn per_box_fields_and_the_drop_thresholds_follow_the_boxes() {
    // Beside each box its label, a float32 row of 2 (minus the label, minus twice it) and an
    // int32 `iscrowd` (the label's parity): whatever a draw keeps of one it keeps of all, in
    // one order, padded or flat.
    let per_sample = |n: usize, f: &dyn Fn(i64) -> Vec<u8>| -> Vec<u8> {
        sample_boxes(n).iter().flat_map(|(_, l)| f(*l)).collect()
    };
    let boxes = |n: usize| -> Vec<u8> {
        sample_boxes(n)
            .iter()
            .flat_map(|(b, _)| b.iter().flat_map(|v| v.to_ne_bytes()))
            .collect()
    };
    let source = MemorySource::new()
        .with_tensor("image", DType::F32, &[2, S, S], vec![0; N * 2 * S * S * 4])
        .and_then(|s| s.with_ragged("boxes", DType::F32, &[4], (0..N).map(boxes).collect()))
        .and_then(|s| {
            let labels = (0..N).map(|n| per_sample(n, &|l| l.to_ne_bytes().to_vec()));
            s.with_ragged("labels", DType::I64, &[], labels.collect())
        })
        .and_then(|s| {
            let extra = |l: i64| {
                [-l as f32, -2.0 * l as f32]
                    .iter()
                    .flat_map(|v| v.to_ne_bytes())
                    .collect()
            };
            s.with_ragged(
                "extra",
                DType::F32,
                &[2],
                (0..N).map(|n| per_sample(n, &extra)).collect(),
            )
        })
        .and_then(|s| {
            let crowd = |l: i64| ((l % 2) as i32).to_ne_bytes().to_vec();
            s.with_ragged(
                "iscrowd",
                DType::I32,
                &[],
                (0..N).map(|n| per_sample(n, &crowd)).collect(),
            )
        })
        .unwrap();
    let source = Arc::new(source);
    let run = |thresholds: &str, ragged: &str| {
        let spec = format!(
            "fields(image=image, boxes=boxes, labels=labels, per_box=extra,iscrowd{thresholds}) \
             | random_resized_crop(32, scale=0.2:1) | hflip"
        );
        let mut l = memory_loader(
            source.clone(),
            &[
                ("transform", &spec),
                ("input_layout", "chw"),
                ("pad", "-1"),
                ("ragged", ragged),
            ],
        )
        .unwrap();
        let flat = ragged == "offsets";
        let mut kept = Vec::new();
        while let Some(b) = l.next().unwrap() {
            let boxes = rows_by_sample(&b, "boxes", 16, flat);
            let labels = rows_by_sample(&b, "labels", 8, flat);
            let extra = rows_by_sample(&b, "extra", 8, flat);
            let crowd = rows_by_sample(&b, "iscrowd", 4, flat);
            for s in 0..b.len() {
                assert_eq!(boxes[s].len(), labels[s].len());
                assert_eq!(
                    (extra[s].len(), crowd[s].len()),
                    (labels[s].len(), labels[s].len())
                );
                for k in 0..labels[s].len() {
                    let l = i64::from_ne_bytes(labels[s][k].clone().try_into().unwrap());
                    let e: Vec<f32> = extra[s][k]
                        .chunks_exact(4)
                        .map(|x| f32::from_ne_bytes(x.try_into().unwrap()))
                        .collect();
                    assert_eq!(e, [-l as f32, -2.0 * l as f32], "the row of label {l}");
                    let c = i32::from_ne_bytes(crowd[s][k].clone().try_into().unwrap());
                    assert_eq!(c, (l % 2) as i32, "the iscrowd of label {l}");
                    let b: Vec<f32> = boxes[s][k]
                        .chunks_exact(4)
                        .map(|x| f32::from_ne_bytes(x.try_into().unwrap()))
                        .collect();
                    kept.push((b[2] - b[0], b[3] - b[1]));
                }
            }
        }
        kept
    };
    for ragged in ["pad", "offsets"] {
        let loose = run("", ragged);
        let strict = run(", min_size=6, min_area=60", ragged);
        assert!(
            loose.iter().all(|&(w, h)| w >= 1.0 && h >= 1.0),
            "{loose:?}"
        );
        assert!(
            strict
                .iter()
                .all(|&(w, h)| w >= 6.0 && h >= 6.0 && w * h >= 60.0),
            "{strict:?}"
        );
        assert!(
            !strict.is_empty() && strict.len() < loose.len(),
            "{ragged}: {} kept of {}",
            strict.len(),
            loose.len()
        );
    }
    let e = memory_loader(
        source.clone(),
        &[
            (
                "transform",
                "fields(image=image, boxes=boxes, per_box=nothing) | hflip",
            ),
            ("input_layout", "chw"),
            ("pad", "-1"),
        ],
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.contains("fields(per_box=nothing): the source has no field"),
        "{e}"
    );
}
