//! The real CUDA path. Runs when a driver and a device are present; otherwise each test prints
//! `SKIPPED: no CUDA driver/device` (visible with `--nocapture`) and passes. The behaviour without
//! a driver is checked here too: `device=cuda` must fail with `Unsupported` and say why.

use std::sync::Arc;

use stoker_core::{
    DType, DeviceBackend, ErrorKind, Loader, LoaderOptions, MemorySource, Source, SourceSpec,
};

/// `n` samples: field `x` = 48 float32 values derived from i, field `y` = i as uint8.
fn source(n: usize) -> Arc<dyn Source> {
    let x: Vec<u8> = (0..n * 48)
        .flat_map(|v| (v as f32 * 0.5).to_ne_bytes())
        .collect();
    let y: Vec<u8> = (0..n).map(|i| i as u8).collect();
    Arc::new(
        MemorySource::new()
            .with_tensor("x", DType::F32, &[48], x)
            .unwrap()
            .with_tensor("y", DType::U8, &[], y)
            .unwrap(),
    )
}

fn options(kv: &[(&str, &str)]) -> LoaderOptions {
    let mut o = LoaderOptions::new().with_source(SourceSpec::Custom(source(100)));
    for (k, v) in kv {
        o.set(k, v).unwrap();
    }
    o
}

/// Why CUDA cannot be used here, if it cannot.
fn unavailable() -> Option<String> {
    #[cfg(feature = "cuda")]
    {
        stoker_core::cuda::probe().err().map(|e| e.to_string())
    }
    #[cfg(not(feature = "cuda"))]
    {
        Some("built without the `cuda` feature".into())
    }
}

/// How far a device's decode is from the CPU's: the largest and the mean difference of the
/// bytes, in levels. nvJPEG's IDCT differs from libjpeg-turbo's by a few levels.
fn levels_apart(got: &[u8], want: &[u8]) -> (u8, f64) {
    let diffs = || got.iter().zip(want).map(|(a, b)| a.abs_diff(*b));
    let sum: u64 = diffs().map(u64::from).sum();
    (
        diffs().max().unwrap_or(0),
        sum as f64 / want.len().max(1) as f64,
    )
}

#[test]
fn device_cuda_without_a_driver_or_device_is_unsupported_never_a_panic() {
    let Some(why) = unavailable() else {
        eprintln!("SKIPPED: a CUDA device is present, so the no-driver error cannot be seen");
        return;
    };
    let Err(err) = Loader::new(&options(&[("device", "cuda"), ("batch_size", "4")])) else {
        panic!("device=cuda succeeded although CUDA is unavailable here: {why}");
    };
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    let msg = err.to_string();
    assert!(msg.starts_with("device=cuda:0: "), "{msg}");
    #[cfg(feature = "cuda")]
    assert!(
        msg.contains("no CUDA driver (libcuda.so) found")
            || msg.contains("CUDA driver present but no device")
            || msg.contains("CUDA driver present but"),
        "{msg}"
    );
    #[cfg(not(feature = "cuda"))]
    assert!(msg.contains("no CUDA support"), "{msg}");
    eprintln!("device=cuda here: {msg} (probe: {why})");
    // Probing again is just as safe.
    assert!(Loader::new(&options(&[("device", "cuda:3")])).is_err());
}

#[cfg(feature = "cuda")]
#[test]
fn real_device_batches_hold_the_host_data() {
    use stoker_core::cuda::{CudaDevice, DeviceBackend};

    if let Some(why) = unavailable() {
        eprintln!("SKIPPED: no CUDA driver/device ({why})");
        return;
    }
    let kv = [
        ("batch_size", "8"),
        ("num_workers", "2"),
        ("shuffle", "true"),
    ];
    let mut dev_options = options(&kv);
    dev_options.set("device", "cuda:0").unwrap();
    let mut dev = Loader::new(&dev_options).unwrap();
    let mut cpu = Loader::new(&options(&kv)).unwrap();
    // A second handle on the same primary context, to read device memory back.
    let reader = CudaDevice::open(0).unwrap();
    let mut batches = 0;
    while let Some(d) = dev.next().unwrap() {
        let h = cpu.next().unwrap().unwrap();
        assert_eq!(d.device_type(), stoker_core::DeviceType::Cuda);
        d.wait(stoker_core::cuda::Stream::DEFAULT).unwrap();
        d.synchronize().unwrap();
        for i in 0..d.num_fields() {
            let expected = h.field(i).unwrap().data.unwrap();
            let mut back = vec![0u8; expected.len()];
            // SAFETY: the field's device range holds `back.len()` bytes and its copy completed.
            unsafe { reader.copy_to_host(&mut back, d.field(i).unwrap().address) }.unwrap();
            assert_eq!(back, expected, "batch {} field {i}", d.position());
        }
        batches += 1;
    }
    assert_eq!(batches, dev.batches_per_epoch());
    assert!(cpu.next().unwrap().is_none());
    let stats = dev.stats();
    assert_eq!(stats.batches as usize, batches);
    eprintln!("real CUDA path: {batches} batches verified on cuda:0");
}

#[cfg(feature = "cuda")]
#[test]
fn real_device_dropping_mid_epoch_with_held_batches() {
    if let Some(why) = unavailable() {
        eprintln!("SKIPPED: no CUDA driver/device ({why})");
        return;
    }
    let mut o = options(&[
        ("batch_size", "4"),
        ("num_workers", "2"),
        ("device", "cuda"),
    ]);
    o.set("prefetch_factor", "3").unwrap();
    let mut l = Loader::new(&o).unwrap();
    let held = l.next().unwrap().unwrap();
    let _ = l.next().unwrap().unwrap();
    drop(l);
    held.synchronize().unwrap();
    drop(held);
}

/// `gpu_normalize` on the real device: the cast kernel (PTX loaded by the driver) writes the
/// CPU path's bytes for every float type and layout, RGB and a 5-band stack, including grids
/// the kernel must stride over: 66,000 rows (past the grid's 65,535) and rows of 17 million
/// elements (past 65,535 blocks of 256).
#[cfg(feature = "cuda")]
#[test]
fn real_device_casts_image_fields_bit_identically_to_the_cpu_path() {
    use stoker_core::cuda::{CudaDevice, DeviceBackend};

    if let Some(why) = unavailable() {
        eprintln!("SKIPPED: no CUDA driver/device ({why})");
        return;
    }
    let reader = CudaDevice::open(0).unwrap();
    // (samples, height, width, channels, batch size): small images, a 5-band stack, one row
    // per channel past the grid's y limit, and one huge image.
    let shapes = [
        (12, 7, 5, 3, 4),
        (12, 7, 5, 5, 4),
        (22_000, 1, 1, 3, 22_000),
        (1, 2_400, 2_400, 3, 1),
    ];
    for (n, h, w, c, batch) in shapes {
        let pixels: Vec<u8> = (0..n * h * w * c).map(|i| (i * 37 % 251) as u8).collect();
        let source: Arc<dyn Source> = Arc::new(
            MemorySource::new()
                .with_tensor("image", DType::U8, &[h, w, c], pixels)
                .unwrap(),
        );
        for (dtype, layout) in [
            ("float32", "nchw"),
            ("float32", "nhwc"),
            ("bfloat16", "nchw"),
            ("float16", "nhwc"),
        ] {
            let mut o = LoaderOptions::new().with_source(SourceSpec::Custom(source.clone()));
            for (k, v) in [
                ("batch_size", batch.to_string().as_str()),
                ("transform", "hflip | normalize(mean=0.45, std=0.226)"),
                ("input_layout", "hwc"),
                ("dtype", dtype),
                ("layout", layout),
                ("seed", "3"),
            ] {
                o.set(k, v).unwrap();
            }
            let mut cpu = Loader::new(&o).unwrap();
            o.set("device", "cuda:0").unwrap();
            let mut dev = Loader::new(&o).unwrap();
            let stats = dev.stats_handle();
            while let Some(d) = dev.next().unwrap() {
                let hb = cpu.next().unwrap().unwrap();
                d.synchronize().unwrap();
                let expected = hb.field_by_name("image").unwrap().data.unwrap();
                let mut back = vec![0u8; expected.len()];
                let address = d.field_by_name("image").unwrap().address;
                // SAFETY: the field's device range holds `back.len()` bytes; the batch is ready.
                unsafe { reader.copy_to_host(&mut back, address) }.unwrap();
                assert!(
                    back == expected,
                    "{n}x{h}x{w}x{c} {dtype} {layout}: batch {} differs from the CPU path",
                    d.position()
                );
            }
            // Every batch copied (the prefetch thread runs ahead) crossed as its uint8 pixels
            // and its table: all batches are full here, so the total is a whole number of them.
            drop(dev);
            let crossed = stats.snapshot().h2d_bytes;
            let element = if dtype == "float32" { 4 } else { 2 };
            let per_batch = (batch * h * w * c + c * 256 * element) as u64;
            assert!(
                crossed > 0 && crossed.is_multiple_of(per_batch),
                "{dtype}: {crossed} bytes crossed, not a whole number of {per_batch}-byte batches"
            );
        }
    }
    eprintln!("real CUDA path: gpu_normalize casts verified on cuda:0");
}

/// Device memory holding `bytes`, copied there (and synchronized).
#[cfg(feature = "cuda")]
fn upload(device: &stoker_core::cuda::CudaDevice, bytes: &[u8]) -> stoker_core::cuda::DevicePtr {
    use stoker_core::cuda::DeviceBackend;
    let ptr = device.alloc(bytes.len().max(1)).unwrap();
    let stream = stoker_core::Stream::DEFAULT;
    // SAFETY: `ptr` holds `bytes.len()` bytes; the event below waits for the copy while
    // `bytes` lives.
    unsafe { device.copy_to_device_async(ptr, bytes.as_ptr(), bytes.len(), stream) }.unwrap();
    let done = device.create_event().unwrap();
    device.record_event(done, stream).unwrap();
    device.synchronize_event(done).unwrap();
    // SAFETY: created above, destroyed once.
    unsafe { device.destroy_event(done) };
    ptr
}

#[test]
fn real_device_resize_kernel_is_its_host_reference_bit_for_bit() {
    #[cfg(feature = "cuda")]
    {
        use stoker_core::cuda::resize::run_on_host;
        use stoker_core::cuda::{CudaDevice, DeviceBackend, ResizeJob};
        use stoker_core::transform::Taps;

        if let Some(why) = unavailable() {
            eprintln!("SKIPPED: no CUDA driver/device ({why})");
            return;
        }
        let device = CudaDevice::open(0).unwrap();
        device.load_kernels().unwrap();
        // (source w, h, crop [left, top, w, h], output w, h): shrink, enlarge, a copy, a
        // clip at the edge, a 30x shrink, and an output past the grid's x limit of one block.
        let cases = [
            (640, 480, [10.5, 20.25, 400.0, 300.0], 224, 224),
            (50, 40, [0.0, 0.0, 50.0, 40.0], 224, 160),
            (64, 64, [8.0, 8.0, 32.0, 32.0], 32, 32),
            (300, 200, [250.0, 150.0, 50.0, 50.0], 17, 13),
            (3000, 2000, [0.0, 0.0, 3000.0, 2000.0], 100, 67),
            (1200, 8, [0.0, 0.0, 1200.0, 8.0], 2100, 3),
        ];
        for (sw, sh, [left, top, cw, ch], w, h) in cases {
            let src: Vec<u8> = (0..sw * sh * 3).map(|i| (i * 31 % 253) as u8).collect();
            let x = Taps::for_axis(left, cw, w, (0, sw)).unwrap();
            let y = Taps::for_axis(top, ch, h, (0, sh)).unwrap();
            let mut taps = Vec::new();
            x.write_to(&mut taps);
            y.write_to(&mut taps);
            let src_ptr = upload(&device, &src);
            let taps_ptr = upload(&device, &taps);
            let out = w * h * 3;
            let dst = device.alloc(out).unwrap();
            let x_weights = taps_ptr + (w * 8) as u64;
            let y_spans = x_weights + (w * x.taps * 4) as u64;
            for (planar, flip) in [(false, false), (true, true), (false, true)] {
                let job = ResizeJob {
                    src: src_ptr,
                    src_width: sw as u32,
                    src_height: sh as u32,
                    dst,
                    width: w as u32,
                    height: h as u32,
                    planar,
                    flip,
                    x_spans: taps_ptr,
                    x_weights,
                    x_taps: x.taps as u32,
                    y_spans,
                    y_weights: y_spans + (h * 8) as u64,
                    y_taps: y.taps as u32,
                };
                let stream = stoker_core::Stream::DEFAULT;
                // SAFETY: every range the job names was allocated above and stays so.
                unsafe { device.resize_async(&job, stream) }.unwrap();
                let done = device.create_event().unwrap();
                device.record_event(done, stream).unwrap();
                device.synchronize_event(done).unwrap();
                // SAFETY: created above, destroyed once.
                unsafe { device.destroy_event(done) };
                let mut got = vec![0u8; out];
                // SAFETY: `dst` holds `out` bytes, written by the completed kernel.
                unsafe { device.copy_to_host(&mut got, dst) }.unwrap();
                let mut want = vec![0u8; out];
                run_on_host(&job, &src, (&x, &y), &mut want);
                assert!(
                    got == want,
                    "{sw}x{sh} -> {w}x{h} planar={planar} flip={flip}: the kernel differs from its reference"
                );
            }
            // SAFETY: nothing queued uses them any more.
            unsafe {
                device.free(src_ptr);
                device.free(taps_ptr);
                device.free(dst);
            }
        }
        eprintln!("real CUDA path: the resize kernel matches its host reference on cuda:0");
    }
}

#[test]
fn real_device_decodes_jpegs_within_a_few_levels_of_the_cpu() {
    #[cfg(feature = "cuda")]
    {
        use stoker_core::cuda::{CudaDevice, DeviceBackend, JpegJob};
        use stoker_core::decode::{decode_rgb, DecodeBuffers};

        if let Some(why) = unavailable() {
            eprintln!("SKIPPED: no CUDA driver/device ({why})");
            return;
        }
        let device = CudaDevice::open(0).unwrap();
        if let Err(e) = device.load_jpeg_decoder() {
            panic!("a CUDA device without nvJPEG: {e} (set STOKER_NVJPEG_LIBRARY)");
        }
        let files = ["photo_baseline.jpg", "photo_444.jpg", "photo_gray.jpg"];
        let jpegs: Vec<Vec<u8>> = files
            .iter()
            .map(|f| crate::support::files::test_image(f))
            .collect();
        let mut wants = Vec::new();
        let mut jobs = Vec::new();
        for jpeg in &jpegs {
            let mut bufs = DecodeBuffers::default();
            let dims = decode_rgb(jpeg, u64::MAX, &mut bufs).unwrap();
            let dst = device.alloc(bufs.rgb.len()).unwrap();
            jobs.push(JpegJob {
                data: jpeg,
                width: dims.width as u32,
                height: dims.height as u32,
                dst,
            });
            wants.push(bufs.rgb);
        }
        // A progressive file: the device decoder may take it or refuse it, never fail.
        let stream = device.create_stream().unwrap();
        let mut failed = Vec::new();
        // SAFETY: the JPEGs and destinations live until the event below completes.
        unsafe { device.decode_jpegs_async(&jobs, stream, &mut failed) }.unwrap();
        let done = device.create_event().unwrap();
        device.record_event(done, stream).unwrap();
        device.synchronize_event(done).unwrap();
        assert!(failed.is_empty(), "refused {failed:?}");
        for ((job, want), file) in jobs.iter().zip(&wants).zip(files) {
            let mut got = vec![0u8; want.len()];
            // SAFETY: `job.dst` holds the decoded image; the decode completed.
            unsafe { device.copy_to_host(&mut got, job.dst) }.unwrap();
            let (max, mean) = levels_apart(&got, want);
            eprintln!("nvJPEG against the CPU's decoder, {file}: {max} levels at most, {mean:.3} on average");
            assert!(
                mean <= 2.0 && max <= 64,
                "{file}: {max} levels at most, {mean:.3} on average"
            );
            // SAFETY: nothing queued uses it any more.
            unsafe { device.free(job.dst) };
        }
        // SAFETY: created above, destroyed once.
        unsafe {
            device.destroy_event(done);
            device.destroy_stream(stream);
        }
    }
}

/// The damage real crawls contain (`testing::damaged_jpegs`), each between two good photos in
/// one call, twice: every good photo decodes as it does on its own, so a damaged file changes
/// nothing for the next one, and every complete file (ending in EOI, as the loader requires of
/// what it sends to the device) that no decoder can read is refused, so that the loader decodes
/// it on the CPU, which reports it for that sample alone. Incomplete files never reach the device
/// from the loader, and files that only some decoders read may go either way: what the device did
/// with each is printed. On an A100 or H100 the hardware backend takes the baseline files in one
/// batch, so this shows whether it reports a damaged scan or decodes it silently.
fn damaged_jpegs_among_good_ones(device: &dyn DeviceBackend) {
    use stoker_core::cuda::JpegJob;
    use stoker_core::decode::{decode_rgb, DecodeBuffers};
    use stoker_core::testing::damaged_jpegs;

    if let Err(e) = device.load_jpeg_decoder() {
        panic!("a CUDA device without nvJPEG: {e} (set STOKER_NVJPEG_LIBRARY)");
    }
    let good = crate::support::files::test_image("photo_baseline.jpg");
    let mut bufs = DecodeBuffers::default();
    let dims = decode_rgb(&good, u64::MAX, &mut bufs).unwrap();
    let want = bufs.rgb.clone();
    let (width, height) = (dims.width as u32, dims.height as u32);
    let damaged = damaged_jpegs(&good);
    // good, damaged, good, damaged, …, good.
    let mut files: Vec<(&str, &[u8])> = vec![("good", &good)];
    for d in &damaged {
        files.push((d.name, &d.bytes));
        files.push(("good", &good));
    }
    let dsts: Vec<u64> = files
        .iter()
        .map(|_| device.alloc(want.len()).unwrap())
        .collect();
    let jobs: Vec<JpegJob<'_>> = files
        .iter()
        .zip(&dsts)
        .map(|(&(_, data), &dst)| JpegJob {
            data,
            width,
            height,
            dst,
        })
        .collect();
    let stream = device.create_stream().unwrap();
    let done = device.create_event().unwrap();
    for round in 0..2 {
        let mut failed = Vec::new();
        // SAFETY: the files and destinations live until the event below completes.
        unsafe { device.decode_jpegs_async(&jobs, stream, &mut failed) }.unwrap();
        device.record_event(done, stream).unwrap();
        device.synchronize_event(done).unwrap();
        for (i, d) in damaged.iter().enumerate() {
            let refused = failed.contains(&(2 * i + 1));
            let verdict = if refused { "refused" } else { "decoded" };
            eprintln!("round {round}: {}: {verdict}", d.name);
            let complete = d.bytes.ends_with(&[0xFF, 0xD9]);
            assert!(
                refused || !d.always_fails || !complete,
                "{}: decoded on the device, although no decoder can read it",
                d.name
            );
        }
        for (i, job) in jobs.iter().enumerate().step_by(2) {
            assert!(!failed.contains(&i), "good photo {i} refused: {failed:?}");
            let mut got = vec![0u8; want.len()];
            // SAFETY: `job.dst` holds the decoded image; the decode completed.
            unsafe { device.copy_to_host(&mut got, job.dst) }.unwrap();
            let (max, mean) = levels_apart(&got, &want);
            assert!(
                mean <= 2.0 && max <= 64,
                "good photo {i} after {:?}: {max} levels at most, {mean:.3} on average",
                files[i.saturating_sub(1)].0
            );
        }
    }
    eprintln!(
        "{} damaged files among good ones, twice; every good one decoded",
        damaged.len()
    );
    // SAFETY: every queued use completed (the event above); each is freed once.
    unsafe {
        for dst in dsts {
            device.free(dst);
        }
        device.destroy_event(done);
        device.destroy_stream(stream);
    }
}

#[test]
fn real_device_refuses_damaged_jpegs_and_decodes_the_good_ones_beside_them() {
    #[cfg(feature = "cuda")]
    {
        if let Some(why) = unavailable() {
            eprintln!("SKIPPED: no CUDA driver/device ({why})");
            return;
        }
        let device = stoker_core::cuda::CudaDevice::open(0).unwrap();
        damaged_jpegs_among_good_ones(&*device);
    }
}

/// The check above where no GPU is, against the fake device (which decodes on the CPU and takes
/// what the loader would send to a device): so that a mistake in the check itself shows here, not
/// first on a GPU machine.
#[test]
fn the_damaged_jpeg_check_passes_on_the_fake_device() {
    let fake = stoker_core::testing::FakeDevice::new(0).unwrap();
    damaged_jpegs_among_good_ones(&*fake);
}

#[test]
fn real_device_loader_decodes_on_the_gpu_and_leaves_odd_files_to_the_cpu() {
    #[cfg(feature = "cuda")]
    {
        use stoker_core::cuda::{CudaDevice, DeviceBackend};

        if let Some(why) = unavailable() {
            eprintln!("SKIPPED: no CUDA driver/device ({why})");
            return;
        }
        let reader = CudaDevice::open(0).unwrap();
        let field = |b: &stoker_core::Batch, name: &str| -> Vec<u8> {
            let f = b.field_by_name(name).unwrap();
            let mut back = vec![0u8; f.shape.iter().product::<usize>() * f.dtype.size()];
            // SAFETY: the field's device range holds `back.len()` bytes; the batch is ready.
            unsafe { reader.copy_to_host(&mut back, f.address) }.unwrap();
            back
        };
        let dir = crate::support::files::tmp("cuda-gpu-decode");
        let kinds = [
            "photo_baseline.jpg",
            "photo_444.jpg",
            "photo_gray.jpg",
            "photo_progressive.jpg",
            "photo_cmyk.jpg",
        ];
        let members: Vec<(String, Vec<u8>)> = (0..40)
            .flat_map(|i| {
                [
                    (
                        format!("{i:04}.jpg"),
                        crate::support::files::test_image(kinds[i % kinds.len()]),
                    ),
                    (format!("{i:04}.cls"), (i % 3).to_string().into_bytes()),
                ]
            })
            .collect();
        let path = dir.join("kinds.tar");
        crate::support::files::write_tar(&path, &members);
        let mut o = LoaderOptions::new();
        for (k, v) in [
            ("source", format!("tar:{}", path.display()).as_str()),
            ("batch_size", "8"),
            ("seed", "9"),
            (
                "transform",
                "random_resized_crop(64) | hflip | normalize(imagenet)",
            ),
            ("dtype", "float32"),
        ] {
            o.set(k, v).unwrap();
        }
        let mut cpu = Loader::new(&o).unwrap();
        o.set("device", "cuda:0").unwrap();
        o.set("jpeg_decoder", "gpu").unwrap();
        let mut dev = Loader::new(&o).unwrap();
        let stats = dev.stats_handle();
        let (mut worst, mut total, mut n) = (0f32, 0f64, 0usize);
        while let Some(d) = dev.next().unwrap() {
            let h = cpu.next().unwrap().unwrap();
            d.synchronize().unwrap();
            let want = h.field_by_name("jpg").unwrap().data.unwrap();
            let got = field(&d, "jpg");
            let floats = |b: &[u8]| -> Vec<f32> {
                b.chunks_exact(4)
                    .map(|w| f32::from_ne_bytes([w[0], w[1], w[2], w[3]]))
                    .collect()
            };
            for (a, b) in floats(&got).iter().zip(floats(want)) {
                // In levels of the uint8 image: the largest std of imagenet's normalize is 0.229.
                let levels = (a - b).abs() * 255.0 * 0.229;
                worst = worst.max(levels);
                total += f64::from(levels);
                n += 1;
            }
            assert_eq!(
                field(&d, "cls"),
                h.field_by_name("cls").unwrap().data.unwrap()
            );
        }
        drop(dev);
        let s = stats.snapshot();
        let mean = total / n.max(1) as f64;
        eprintln!(
        "real CUDA path: {} images decoded on cuda:0; {worst:.1} levels at most, {mean:.3} on average from the CPU path",
        s.decoded_device
    );
        assert!(s.decoded_device >= 24, "{}", s.decoded_device);
        assert!(
            mean <= 2.0 && worst <= 64.0,
            "{worst} levels at most, {mean} on average"
        );
    }
}
