//! The real CUDA path. Runs when a driver and a device are present; otherwise each test prints
//! `SKIPPED: no CUDA driver/device` (visible with `--nocapture`) and passes. The behaviour without
//! a driver is checked here too: `device=cuda` must fail with `Unsupported` and say why.

use std::sync::Arc;

use stoker_core::{DType, ErrorKind, Loader, LoaderOptions, MemorySource, Source, SourceSpec};

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
