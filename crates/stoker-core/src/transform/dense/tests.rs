//! The dense pipeline against the RGB8 one, plane by plane.

use super::*;
use crate::transform::Pipeline;

const H: usize = 40;
const W: usize = 48;
const C: usize = 13;

fn rng(index: u64) -> Rng {
    Rng::for_key(7, Stream::Augment, 0, index)
}

/// A `[H, W, C]` uint8 tensor with varied, structured values.
fn hwc_u8() -> Vec<u8> {
    (0..H * W * C)
        .map(|i| {
            let (px, c) = (i / C, i % C);
            let (y, x) = (px / W, px % W);
            ((x * 5 + y * 3 + c * 19 + (x * y) % 7) % 256) as u8
        })
        .collect()
}

fn shape(channels: usize, dtype: DType, layout: InputLayout) -> TensorShape {
    TensorShape {
        height: H,
        width: W,
        channels,
        dtype,
        layout,
    }
}

fn image(spec: &str, input: TensorShape, dtype: Option<DType>) -> DensePipeline {
    DensePipeline::new(Some(spec), input, Role::Image, dtype, Layout::Nchw).unwrap()
}

fn run(p: &DensePipeline, src: &[u8], index: u64) -> Vec<u8> {
    let mut out = vec![0; p.output_bytes()];
    p.apply(src, &mut rng(index), &mut out, &mut DenseScratch::default())
        .unwrap();
    out
}

/// Channels `3g..3g+3` (the last repeated past `C`) run through the RGB pipeline: the
/// reference for each plane of a dense uint8 image.
fn by_rgb_groups(spec: &str, hwc: &[u8], index: u64) -> Vec<u8> {
    let rgb = Pipeline::for_input(Some(spec), None, Layout::Nchw, H, W).unwrap();
    let (oh, ow) = rgb.output_size();
    let mut planes = vec![0u8; C * oh * ow];
    for g in 0..C.div_ceil(3) {
        let ch = |k: usize| (3 * g + k).min(C - 1);
        let px: Vec<u8> = hwc
            .chunks_exact(C)
            .flat_map(|p| [p[ch(0)], p[ch(1)], p[ch(2)]])
            .collect();
        let mut out = vec![0; rgb.output_bytes()];
        rgb.apply_rgb(&px, W, H, &mut rng(index), &mut out).unwrap();
        for k in 0..3 {
            if 3 * g + k < C {
                planes[(3 * g + k) * oh * ow..][..oh * ow]
                    .copy_from_slice(&out[k * oh * ow..][..oh * ow]);
            }
        }
    }
    planes
}

#[test]
fn every_plane_of_a_13_channel_uint8_image_equals_the_rgb_path_on_its_channels() {
    let hwc = hwc_u8();
    for spec in [
        "random_resized_crop(32) | hflip",
        "resize(20) | center_crop(16, 18) | vflip(p=1)",
        "random_resized_crop(24, 20) | random_crop(20, padding=3, pad_mode=reflect) | vflip",
        "center_crop(32) | rotate(40, fill=9) | affine(degrees=10, translate=0.1:0.2, scale=0.8:1.2, shear=5)",
        "random_crop(30, padding=2, fill=4) | hflip | random_erasing(p=1, value=7)",
        "scale_jitter(40, scale=0.5:2) | random_crop(32, padding=20, fill=4) | hflip",
    ] {
        let p = image(spec, shape(C, DType::U8, InputLayout::Hwc), None);
        assert_eq!(p.dtype(), DType::U8);
        for index in 0..6 {
            assert_eq!(
                run(&p, &hwc, index),
                by_rgb_groups(spec, &hwc, index),
                "`{spec}`, sample {index}"
            );
        }
    }
}

#[test]
fn the_output_pass_writes_what_the_rgb_tables_write_for_every_type_and_layout() {
    // Three uint8 channels through the dense pipeline and through the RGB one: the f64
    // formula rounded once is the RGB path's per-channel table, bit for bit.
    let rgb: Vec<u8> = hwc_u8()
        .chunks_exact(C)
        .flat_map(|p| [p[0], p[5], p[11]])
        .collect();
    let spec = "random_resized_crop(20, 24) | hflip | normalize(imagenet) | random_erasing(p=1, value=random)";
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for layout in [Layout::Nchw, Layout::Nhwc] {
            let input = shape(3, DType::U8, InputLayout::Hwc);
            let dense =
                DensePipeline::new(Some(spec), input, Role::Image, Some(dtype), layout).unwrap();
            let reference = Pipeline::for_input(Some(spec), Some(dtype), layout, H, W).unwrap();
            assert_eq!(dense.shape(), reference.shape());
            for index in 0..4 {
                let mut want = vec![0; reference.output_bytes()];
                reference
                    .apply_rgb(&rgb, W, H, &mut rng(index), &mut want)
                    .unwrap();
                assert_eq!(run(&dense, &rgb, index), want, "{dtype} {layout:?} {index}");
            }
        }
    }
}

#[test]
fn channels_first_and_last_give_the_same_planes() {
    let hwc = hwc_u8();
    let mut chw = vec![0u8; hwc.len()];
    for (i, px) in hwc.chunks_exact(C).enumerate() {
        for c in 0..C {
            chw[c * H * W + i] = px[c];
        }
    }
    let spec = "random_resized_crop(16) | hflip | normalize(mean=0.5, std=0.25)";
    let a = image(spec, shape(C, DType::U8, InputLayout::Hwc), None);
    let b = image(spec, shape(C, DType::U8, InputLayout::Chw), None);
    assert_eq!(a.shape(), vec![C, 16, 16]);
    assert_eq!(run(&a, &hwc, 3), run(&b, &chw, 3));
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

#[test]
fn float_images_are_resampled_in_float_and_half_types_through_float32() {
    // The uint8 values as float32 plus a fraction that a uint8 round trip would lose.
    let hwc = hwc_u8();
    let as_f32: Vec<f32> = hwc.iter().map(|&v| v as f32 + 0.25).collect();
    let f32_bytes: Vec<u8> = as_f32.iter().flat_map(|v| v.to_ne_bytes()).collect();
    let spec = "random_resized_crop(20) | hflip";
    let fp = image(spec, shape(C, DType::F32, InputLayout::Hwc), None);
    assert_eq!(fp.dtype(), DType::F32, "a float image stays float");
    let up = image(
        spec,
        shape(C, DType::U8, InputLayout::Hwc),
        Some(DType::F32),
    );
    for index in 0..4 {
        let float = f32s(&run(&fp, &f32_bytes, index));
        // The uint8 path scales to [0, 1]; its resample rounded to whole levels.
        let bytes = f32s(&run(&up, &hwc, index));
        let mut fractional = 0;
        for (f, u) in float.iter().zip(&bytes) {
            let u = u * 255.0;
            // uint8's fixed-point filter rounds once more than the float one.
            assert!((f - 0.25 - u).abs() <= 1.0, "{f} vs {u}");
            fractional += usize::from((f - f.round()).abs() > 0.01);
        }
        assert!(
            fractional > float.len() / 2,
            "float values kept their fractions"
        );
    }
    // float16 and bfloat16 holding the same (exactly representable) values: widened to
    // float32, resampled alike, rounded once to their own type.
    for dtype in [DType::F16, DType::BF16] {
        let exact: Vec<f32> = hwc.iter().map(|&v| (v / 2) as f32).collect();
        let halves: Vec<u8> = exact
            .iter()
            .flat_map(|&v| match dtype {
                DType::F16 => half::f16::from_f32(v).to_ne_bytes(),
                _ => half::bf16::from_f32(v).to_ne_bytes(),
            })
            .collect();
        let exact_bytes: Vec<u8> = exact.iter().flat_map(|v| v.to_ne_bytes()).collect();
        let hp = image(spec, shape(C, dtype, InputLayout::Hwc), None);
        assert_eq!(hp.dtype(), dtype);
        let got = run(&hp, &halves, 1);
        let want = f32s(&run(&fp, &exact_bytes, 1));
        for (g, w) in got.chunks_exact(2).zip(want) {
            let g = match dtype {
                DType::F16 => half::f16::from_ne_bytes([g[0], g[1]]).to_f32(),
                _ => half::bf16::from_ne_bytes([g[0], g[1]]).to_f32(),
            };
            let rounded = match dtype {
                DType::F16 => half::f16::from_f32(w).to_f32(),
                _ => half::bf16::from_f32(w).to_f32(),
            };
            assert_eq!(g, rounded, "{dtype}");
        }
    }
}

#[test]
fn normalize_takes_one_mean_and_std_per_channel_and_layouts_interleave() {
    let hwc = hwc_u8();
    let mean: Vec<String> = (0..C).map(|c| format!("{}", c as f64 / 20.0)).collect();
    let std: Vec<String> = (0..C)
        .map(|c| format!("{}", 0.1 + c as f64 / 50.0))
        .collect();
    let spec = format!(
        "center_crop(8) | normalize(mean={}, std={})",
        mean.join(","),
        std.join(",")
    );
    let input = shape(C, DType::U8, InputLayout::Hwc);
    let p = DensePipeline::new(Some(&spec), input, Role::Image, None, Layout::Nhwc).unwrap();
    assert_eq!((p.dtype(), p.shape()), (DType::F32, vec![8, 8, C]));
    let out = f32s(&run(&p, &hwc, 0));
    let (top, left) = ((H - 8) / 2, (W - 8) / 2);
    for y in 0..8 {
        for x in 0..8 {
            for c in 0..C {
                let v = hwc[((top + y) * W + left + x) * C + c] as f64;
                let m = c as f64 / 20.0;
                let s = 0.1 + c as f64 / 50.0;
                let want = ((v / 255.0 - m) / s) as f32;
                assert_eq!(out[(y * 8 + x) * C + c], want, "({y}, {x}, {c})");
            }
        }
    }
    let e = DensePipeline::new(
        Some("normalize(imagenet)"),
        input,
        Role::Image,
        None,
        Layout::Nchw,
    )
    .unwrap_err();
    assert!(e.contains("3 mean") && e.contains("give 1 or 13"), "{e}");
}

#[test]
fn colour_ops_are_refused_for_images_other_than_rgb8_with_what_the_image_is() {
    for op in [
        "color_jitter(brightness=0.4)",
        "random_photometric_distort",
        "grayscale",
        "gaussian_blur(3)",
        "rand_augment",
        "trivial_augment",
        "auto_augment(imagenet)",
    ] {
        for (channels, dtype) in [
            (C, DType::U8),
            (3, DType::F32),
            (1, DType::U8),
            (3, DType::U16),
        ] {
            let e = DensePipeline::new(
                Some(&format!("center_crop(16) | {op}")),
                shape(channels, dtype, InputLayout::Chw),
                Role::Image,
                None,
                Layout::Nchw,
            )
            .unwrap_err();
            let what = format!("a {channels}-channel {} image", dtype.name());
            assert!(
                e.contains("needs an RGB image (3 channels of uint8)") && e.contains(&what),
                "{op}: {e}"
            );
        }
    }
    let e = DensePipeline::new(
        Some("rotate(10, fill=1,2,3)"),
        shape(C, DType::U8, InputLayout::Hwc),
        Role::Image,
        None,
        Layout::Nchw,
    )
    .unwrap_err();
    assert!(e.contains("13-channel image takes one value"), "{e}");
}

#[test]
fn a_float_image_is_not_rounded_to_uint8() {
    let e = DensePipeline::new(
        Some("center_crop(8)"),
        shape(C, DType::F32, InputLayout::Chw),
        Role::Image,
        Some(DType::U8),
        Layout::Nchw,
    )
    .unwrap_err();
    assert!(
        e.contains("dtype uint8") && e.contains("13-channel float32"),
        "{e}"
    );
}

/// A `[H, W, C]` uint16 tensor spanning the whole range (most values above 255), and the
/// same values as float32: the reference a uint16 image is checked against.
#[test]
fn a_fill_is_in_stored_units_and_the_image_type_must_hold_it() {
    // A crop of the whole image padded by 8 on each side: a border of fill around the image,
    // in values the 8-bit path could not write.
    let spec = |fill: &str| {
        format!(
            "random_crop({}, {}, padding=8, fill={fill})",
            H + 16,
            W + 16
        )
    };
    let (u16_bytes, f32_bytes) = hwc_u16();
    let cases: [(DType, &[u8], &str, f64); 3] = [
        (DType::F32, &f32_bytes, "-0.5", -0.5),
        (DType::U16, &u16_bytes, "1000", 1000.0),
        (DType::U8, &hwc_u8(), "200", 200.0),
    ];
    for (dtype, bytes, fill, value) in cases {
        let p = image(&spec(fill), shape(C, dtype, InputLayout::Hwc), None);
        let out = run(&p, bytes, 0);
        let values: Vec<f64> = match dtype {
            DType::F32 => f32s(&out).iter().map(|&v| v as f64).collect(),
            DType::U16 => u16s(&out).iter().map(|&v| v as f64).collect(),
            _ => out.iter().map(|&v| v as f64).collect(),
        };
        let (ow, plane) = (W + 16, (H + 16) * (W + 16));
        for c in [0, C - 1] {
            let plane = &values[c * plane..(c + 1) * plane];
            assert!(
                plane[..8 * ow].iter().all(|&v| v == value),
                "{dtype}: top rows"
            );
            let inside = plane[8 * ow + 8];
            let stored = match dtype {
                DType::F32 => f32s(bytes)[c] as f64,
                DType::U16 => u16s(bytes)[c] as f64,
                _ => bytes[c] as f64,
            };
            assert_eq!(inside, stored, "{dtype}: the image's first pixel");
        }
    }
    // What the type cannot hold is refused when the pipeline is built, naming the op.
    for (dtype, fill) in [
        (DType::U8, "0.5"),
        (DType::U8, "256"),
        (DType::U16, "65536"),
        (DType::U16, "-1"),
    ] {
        let e = DensePipeline::new(
            Some(&spec(fill)),
            shape(C, dtype, InputLayout::Hwc),
            Role::Image,
            None,
            Layout::Nchw,
        )
        .unwrap_err();
        assert!(
            e.starts_with("random_crop: fill") && e.contains(&format!("not a {dtype} value")),
            "{dtype} {fill}: {e}"
        );
    }
    let e = Pipeline::new(Some("rotate(10, fill=0.5)"), None, Layout::Nchw).unwrap_err();
    assert!(e.contains("rotate: fill 0.5 is not a uint8 value"), "{e}");
    // A mask's uncovered pixels take ignore_index: the op's fill is not the mask's.
    mask_pipeline(&spec("0.5"), DType::U8, 255);
}

fn hwc_u16() -> (Vec<u8>, Vec<u8>) {
    let values: Vec<u16> = (0..H * W * C)
        .map(|i| {
            let (px, c) = (i / C, i % C);
            let (y, x) = (px / W, px % W);
            ((x * 1303 + y * 977 + c * 4099 + (x * y) % 13 * 251) % 65536) as u16
        })
        .collect();
    (
        values.iter().flat_map(|v| v.to_ne_bytes()).collect(),
        values
            .iter()
            .flat_map(|&v| f32::from(v).to_ne_bytes())
            .collect(),
    )
}

fn u16s(bytes: &[u8]) -> Vec<u16> {
    bytes
        .chunks_exact(2)
        .map(|b| u16::from_ne_bytes([b[0], b[1]]))
        .collect()
}

#[test]
fn a_uint16_image_equals_the_float32_path_rounded_once_and_keeps_its_range() {
    let (u16_bytes, f32_bytes) = hwc_u16();
    let above_255 = u16s(&u16_bytes).iter().filter(|&&v| v > 255).count();
    assert!(above_255 > u16_bytes.len() / 4, "the input spans 16 bits");
    for spec in [
        "random_resized_crop(32) | hflip",
        "resize(20) | center_crop(16, 18) | vflip(p=1)",
        "center_crop(24, 30)",
        "random_resized_crop(24, 20) | random_crop(20, padding=3, pad_mode=reflect) | vflip",
        "center_crop(32) | rotate(40, fill=9) | affine(degrees=10, translate=0.1:0.2, scale=0.8:1.2, shear=5)",
        "random_crop(30, padding=2, fill=4) | hflip | random_erasing(p=1, value=7)",
        "scale_jitter(40, scale=0.5:2) | random_crop(32, padding=20, fill=4) | hflip",
    ] {
        for layout in [Layout::Nchw, Layout::Nhwc] {
            let input = shape(C, DType::U16, InputLayout::Hwc);
            let p = DensePipeline::new(Some(spec), input, Role::Image, None, layout).unwrap();
            assert_eq!(p.dtype(), DType::U16, "uint16 stays uint16");
            let f = DensePipeline::new(
                Some(spec),
                shape(C, DType::F32, InputLayout::Hwc),
                Role::Image,
                None,
                layout,
            )
            .unwrap();
            assert_eq!(p.shape(), f.shape());
            let (mut big, mut all) = (0, 0);
            for index in 0..4 {
                let got = u16s(&run(&p, &u16_bytes, index));
                let want: Vec<u16> = f32s(&run(&f, &f32_bytes, index))
                    .iter()
                    .map(|&v| round_ties_even(f64::from(v)).clamp(0.0, 65535.0) as u16)
                    .collect();
                assert_eq!(got, want, "`{spec}` {layout:?}, sample {index}");
                big += got.iter().filter(|&&v| v > 255).count();
                all += got.len();
            }
            // Over the draws: a crop may fall mostly on the padding.
            assert!(big > all / 4, "`{spec}`: values above 255 survive");
        }
    }
    // A whole-pixel crop and a flip copy the stored values exactly.
    let p = image(
        "center_crop(8) | hflip(p=1)",
        shape(C, DType::U16, InputLayout::Hwc),
        None,
    );
    let got = u16s(&run(&p, &u16_bytes, 0));
    let stored = u16s(&u16_bytes);
    let (top, left) = ((H - 8) / 2, (W - 8) / 2);
    for c in 0..C {
        for y in 0..8 {
            for x in 0..8 {
                let want = stored[((top + y) * W + left + 7 - x) * C + c];
                assert_eq!(got[(c * 8 + y) * 8 + x], want, "({c}, {y}, {x})");
            }
        }
    }
    // The top of the range stays there: a resample of a constant 65535 plane (whose float
    // blend may land a hair above it) gives 65535, not a wrapped value.
    let white: Vec<u8> = std::iter::repeat_n(u16::MAX.to_ne_bytes(), H * W)
        .flatten()
        .collect();
    let p = image(
        "random_resized_crop(17, 23) | hflip",
        shape(1, DType::U16, InputLayout::Chw),
        None,
    );
    for index in 0..4 {
        let out = u16s(&run(&p, &white, index));
        assert!(out.iter().all(|&v| v == u16::MAX), "sample {index}");
    }
}

#[test]
fn a_uint16_image_normalizes_to_floats_in_stored_units() {
    let (u16_bytes, f32_bytes) = hwc_u16();
    let spec = "random_resized_crop(20) | hflip | normalize(mean=30000, std=1000)";
    let p = image(spec, shape(C, DType::U16, InputLayout::Hwc), None);
    assert_eq!(p.dtype(), DType::F32, "normalize produces float32");
    let f = image(spec, shape(C, DType::F32, InputLayout::Hwc), None);
    for index in 0..3 {
        // uint16 widens to float32 exactly and is not scaled: the float image's result.
        assert_eq!(run(&p, &u16_bytes, index), run(&f, &f32_bytes, index));
    }
    for dtype in [DType::F16, DType::BF16, DType::F32] {
        let p = image(
            "center_crop(8)",
            shape(C, DType::U16, InputLayout::Hwc),
            Some(dtype),
        );
        assert_eq!(p.dtype(), dtype);
    }
}

#[test]
fn uint16_output_dtypes_are_checked_with_the_reason() {
    let refused = |spec: &str, input: DType, dtype: DType| {
        DensePipeline::new(
            Some(spec),
            shape(C, input, InputLayout::Chw),
            Role::Image,
            Some(dtype),
            Layout::Nchw,
        )
        .unwrap_err()
    };
    let e = refused("center_crop(8)", DType::U16, DType::U8);
    assert!(
        e.contains("dtype uint8") && e.contains("13-channel uint16"),
        "{e}"
    );
    let e = refused(
        "center_crop(8) | normalize(mean=0.5, std=0.2)",
        DType::U16,
        DType::U16,
    );
    assert!(e.contains("normalize produces floats"), "{e}");
    let e = refused("center_crop(8)", DType::U8, DType::U16);
    assert!(e.contains("dtype uint16 is for uint16 images"), "{e}");
    let e = refused("center_crop(8)", DType::F32, DType::U16);
    assert!(e.contains("dtype uint16") && e.contains("float32"), "{e}");
    let e = DensePipeline::new(
        Some("center_crop(8) | random_erasing(p=1, value=random)"),
        shape(C, DType::U16, InputLayout::Chw),
        Role::Image,
        None,
        Layout::Nchw,
    )
    .unwrap_err();
    assert!(e.contains("needs a float output, not uint16"), "{e}");
    let ok = image(
        "center_crop(8)",
        shape(C, DType::U16, InputLayout::Chw),
        Some(DType::U16),
    );
    assert_eq!(ok.dtype(), DType::U16);
}

/// An int32 mask whose label is the pixel's own coordinate, `y * W + x`.
fn coordinate_mask() -> Vec<u8> {
    (0..(H * W) as i32).flat_map(|v| v.to_ne_bytes()).collect()
}

fn mask_pipeline(spec: &str, dtype: DType, ignore_index: i64) -> DensePipeline {
    mask_pipeline_as(spec, dtype, ignore_index, None).unwrap()
}

/// A `[H, W]` mask of `dtype` labels under `spec`, batched as `out` (None: as stored).
fn mask_pipeline_as(
    spec: &str,
    dtype: DType,
    ignore_index: i64,
    out: Option<DType>,
) -> Result<DensePipeline, String> {
    let input = TensorShape {
        channels: 1,
        ..shape(1, dtype, InputLayout::Hwc)
    };
    DensePipeline::new(
        Some(spec),
        input,
        Role::Mask { ignore_index },
        out,
        Layout::Nchw,
    )
}

fn i32s(bytes: &[u8]) -> Vec<i32> {
    bytes
        .chunks_exact(4)
        .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

#[test]
fn a_mask_moves_with_its_image_under_one_draw() {
    // Two float planes holding x and y: the bilinear resample of a linear ramp is the
    // sample point itself, so each image pixel says where it came from, and the mask
    // (labels y * W + x) says which source pixel its label is.
    let coords: Vec<u8> = (0..2 * H * W)
        .map(|i| {
            let (c, px) = (i / (H * W), i % (H * W));
            if c == 0 {
                (px % W) as f32
            } else {
                (px / W) as f32
            }
        })
        .flat_map(|v| v.to_ne_bytes())
        .collect();
    let mask = coordinate_mask();
    for spec in [
        "random_resized_crop(24, 28) | hflip | vflip",
        "resize(30) | center_crop(24) | hflip(p=1)",
        "random_crop(32, padding=4) | vflip | hflip | normalize(mean=0, std=1)",
        "scale_jitter(40, 48, scale=0.5:1.5) | random_crop(32, padding=16) | hflip",
        "random_zoom_out(side_range=1:2, p=0.9) | center_crop(40, 48) | vflip",
    ] {
        let ip = image(spec, shape(2, DType::F32, InputLayout::Chw), None);
        let mp = mask_pipeline(spec, DType::I32, -1);
        assert_eq!(mp.shape(), vec![ip.shape()[1], ip.shape()[2]]);
        let (oh, ow) = ip.output_size();
        for index in 0..8 {
            let img = f32s(&run(&ip, &coords, index));
            let labels = i32s(&run(&mp, &mask, index));
            let mut seen = 0;
            for (i, &label) in labels.iter().enumerate() {
                let (fx, fy) = (img[i], img[oh * ow + i]);
                if label == -1 {
                    // Padding: the image holds the fill there too (0 in both planes).
                    assert_eq!((fx, fy), (0.0, 0.0), "`{spec}` {index}: pixel {i}");
                    continue;
                }
                assert!((0..(H * W) as i32).contains(&label));
                let (mx, my) = ((label as usize % W) as f32, (label as usize / W) as f32);
                // Nearest takes floor(left + j * scale); the filter's centre is
                // left + (j + 0.5) * scale - 0.5: at most half a source pixel apart
                // beyond the half scale (and the border clamps the filter inwards).
                let (y, x) = (i / ow, i % ow);
                let border = y < 2 || x < 2 || y + 2 >= oh || x + 2 >= ow;
                let near = |image: f32, label: f32, scale: f32| {
                    let d = image - label;
                    d >= -0.55 && d <= scale * 0.5 + 0.55
                };
                let flips_agree = (fx - mx).abs() < W as f32 / 2.0;
                assert!(flips_agree, "`{spec}` {index}: pixel {i} x {fx} vs {mx}");
                if !border {
                    let (sx, sy) = (W as f32 / ow as f32, H as f32 / oh as f32);
                    assert!(near(fx, mx, sx.max(1.0) + 1.0), "`{spec}` x {fx} vs {mx}");
                    assert!(near(fy, my, sy.max(1.0) + 1.0), "`{spec}` y {fy} vs {my}");
                }
                seen += 1;
            }
            assert!(seen > 0);
        }
    }
}

#[test]
fn mask_labels_stay_exact_and_uncovered_pixels_take_ignore_index() {
    // uint8 labels 0..5 in blocks; any blending would make values between them.
    let labels: Vec<u8> = (0..H * W)
        .map(|i| [0u8, 1, 7, 30, 200][(i / W / 9 + i % W / 11) % 5])
        .collect();
    for spec in [
        "random_resized_crop(33) | hflip | rotate(35) | color_jitter(brightness=0.5)",
        "affine(degrees=20, translate=0.2:0.2, scale=0.7:1.3, shear=10) | grayscale(p=0.5)",
        "random_crop(44, padding=5, fill=3) | gaussian_blur(3) | random_erasing(p=1)",
        "scale_jitter(40, scale=0.5:2, max_size=70) | random_crop(36, padding=12, fill=3) | hflip",
        "random_zoom_out(fill=3, side_range=1:3, p=0.8) | random_crop(40, 48) | hflip",
    ] {
        let mp = mask_pipeline(spec, DType::U8, 255);
        let mut fills = 0;
        for index in 0..10 {
            let out = run(&mp, &labels, index);
            for &v in &out {
                assert!([0, 1, 7, 30, 200, 255].contains(&v), "`{spec}`: {v}");
            }
            fills += out.iter().filter(|&&v| v == 255).count();
        }
        assert!(fills > 0, "`{spec}` uncovered some pixels");
    }
    // An int64 mask keeps its type and its labels.
    let big: Vec<u8> = (0..(H * W) as i64)
        .flat_map(|v| (v * 1_000_000_007).to_ne_bytes())
        .collect();
    let mp = mask_pipeline("random_resized_crop(16) | hflip", DType::I64, 255);
    assert_eq!(mp.dtype(), DType::I64);
    for b in run(&mp, &big, 2).chunks_exact(8) {
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        assert_eq!(i64::from_ne_bytes(a) % 1_000_000_007, 0);
    }
}

#[test]
fn a_mask_refuses_what_would_move_the_image_without_it() {
    for (spec, needle) in [
        (
            "center_crop(16) | rand_augment",
            "not supported with a mask",
        ),
        (
            "center_crop(16) | mixup(alpha=1, num_classes=2)",
            "batch mixing",
        ),
    ] {
        let e = DensePipeline::new(
            Some(spec),
            TensorShape {
                channels: 1,
                ..shape(1, DType::U8, InputLayout::Hwc)
            },
            Role::Mask { ignore_index: 255 },
            None,
            Layout::Nchw,
        )
        .unwrap_err();
        assert!(e.contains(needle), "{spec}: {e}");
    }
    let e = DensePipeline::new(
        None,
        shape(1, DType::F32, InputLayout::Hwc),
        Role::Mask { ignore_index: 255 },
        None,
        Layout::Nchw,
    )
    .unwrap_err();
    assert!(e.contains("uint8, uint16, int32 or int64 labels"), "{e}");
    let e = DensePipeline::new(
        None,
        shape(1, DType::U8, InputLayout::Hwc),
        Role::Mask { ignore_index: -1 },
        None,
        Layout::Nchw,
    )
    .unwrap_err();
    assert!(e.contains("ignore_index=-1"), "{e}");
}

#[test]
fn uint8_labels_widened_to_int64_are_the_int64_labels_moved() {
    // A PNG mask's labels are decoded as bytes and batched as int64: the same labels stored as
    // int64 must give the same batch, with an ignore_index a byte holds or not.
    let labels: Vec<u8> = (0..H * W).map(|i| ((i / W) * 7 + i % W) as u8).collect();
    let wide: Vec<u8> = labels
        .iter()
        .flat_map(|&v| i64::from(v).to_ne_bytes())
        .collect();
    let spec = "random_resized_crop(24, 28) | random_crop(32, padding=6) | hflip | vflip";
    for ignore_index in [255, -1, 300] {
        let bytes = mask_pipeline_as(spec, DType::U8, ignore_index, Some(DType::I64)).unwrap();
        let int64 = mask_pipeline(spec, DType::I64, ignore_index);
        assert_eq!(bytes.dtype(), DType::I64);
        assert_eq!(bytes.output_bytes(), int64.output_bytes());
        let mut filled = 0;
        for index in 0..6 {
            let out = run(&bytes, &labels, index);
            assert_eq!(
                out,
                run(&int64, &wide, index),
                "ignore_index={ignore_index} {index}"
            );
            filled += out
                .chunks_exact(8)
                .filter(|v| i64::from_ne_bytes((*v).try_into().unwrap()) == ignore_index)
                .count();
        }
        assert!(filled > 0, "ignore_index={ignore_index}: no padding drawn");
    }
    let e = DensePipeline::new(
        None,
        TensorShape {
            channels: 1,
            ..shape(1, DType::I32, InputLayout::Hwc)
        },
        Role::Mask { ignore_index: 255 },
        Some(DType::U8),
        Layout::Nchw,
    )
    .unwrap_err();
    assert!(e.contains("not uint8"), "{e}");
}

#[test]
fn uint16_labels_move_exactly_and_keep_their_type_or_widen_to_int64() {
    // Instance ids past a byte, as 16-bit label maps store them: the uint16 mask must give the
    // labels the same mask stored as int64 gives, as uint16 or widened to int64.
    let ids: Vec<u16> = (0..H * W)
        .map(|i| 1000 + ((i / W / 7) * 9 + i % W / 5) as u16 * 97)
        .collect();
    let narrow: Vec<u8> = ids.iter().flat_map(|v| v.to_ne_bytes()).collect();
    let wide: Vec<u8> = ids
        .iter()
        .flat_map(|&v| i64::from(v).to_ne_bytes())
        .collect();
    let spec = "scale_jitter(40, scale=0.5:2) | random_crop(36, padding=12) | hflip | rotate(20)";
    let kept = mask_pipeline(spec, DType::U16, 65535);
    let widened = mask_pipeline_as(spec, DType::U16, 65535, Some(DType::I64)).unwrap();
    let int64 = mask_pipeline(spec, DType::I64, 65535);
    assert_eq!((kept.dtype(), widened.dtype()), (DType::U16, DType::I64));
    let mut filled = 0;
    for index in 0..8 {
        let reference = run(&int64, &wide, index);
        assert_eq!(run(&widened, &narrow, index), reference, "sample {index}");
        let as_u16: Vec<u8> = reference
            .chunks_exact(8)
            .flat_map(|v| (i64::from_ne_bytes(v.try_into().unwrap()) as u16).to_ne_bytes())
            .collect();
        let out = run(&kept, &narrow, index);
        assert_eq!(out, as_u16, "sample {index}");
        filled += u16s(&out).iter().filter(|&&v| v == 65535).count();
    }
    assert!(filled > 0, "no padding drawn");
    let e = mask_pipeline_as("hflip", DType::U16, 70000, None).unwrap_err();
    assert!(e.contains("ignore_index=70000 does not fit"), "{e}");
}
