//! Device batches through the C ABI, against the core's host-memory `FakeDevice`: the C API has
//! no way to inject a device, so these tests wrap a loader made with
//! `Loader::with_device_backend` in the ordinary handle (`stoker_loader::from_loader`, the same
//! constructor `stoker_loader_new` uses) and drive it through the exported functions. The C suite
//! (`ctests/test_cuda.c`) covers what a machine without CUDA can check from C.

use std::ffi::{c_void, CStr, CString};
use std::ptr::{null, null_mut};
use std::sync::Arc;
use std::time::Duration;

use stoker_core::testing::{counting_source, FailAt, FakeDevice};
use stoker_core::{DeviceBackend, Loader, LoaderOptions, SourceSpec, Stream};

use crate::batch::*;
use crate::dlpack::{DLDeviceType, DLManagedTensorVersioned};
use crate::ffi::into_raw;
use crate::loader::*;
use crate::options::*;
use crate::tests::last_error;
use crate::types::stoker_status::*;
use crate::types::*;

/// Bytes of field `x` for samples `rows`.
fn x_bytes(rows: std::ops::Range<i64>) -> Vec<u8> {
    rows.flat_map(|i| [i, i + 1, i + 2])
        .flat_map(|v| v.to_ne_bytes())
        .collect()
}

fn options(n: usize, kv: &[(&str, &str)]) -> LoaderOptions {
    let mut o = LoaderOptions::new().with_source(SourceSpec::Custom(counting_source(n)));
    o.set("num_workers", "1").unwrap();
    for (k, v) in kv {
        o.set(k, v).unwrap();
    }
    o
}

fn fake(ordinal: u32) -> Arc<FakeDevice> {
    let f = FakeDevice::new(ordinal).unwrap();
    // Copies complete later, on the fake's thread: reading too early shows.
    f.set_copy_delay(Duration::from_millis(2));
    f
}

/// A C loader handle around a loader on the fake device.
fn device_loader(fake: &Arc<FakeDevice>, o: &LoaderOptions) -> *mut stoker_loader {
    let loader = Loader::with_device_backend(o, fake.clone()).unwrap();
    into_raw(stoker_loader::from_loader(loader))
}

fn next(l: *mut stoker_loader) -> *mut stoker_batch {
    let mut b = null_mut();
    assert_eq!(stoker_loader_next(l, &mut b), STOKER_OK, "{}", last_error());
    assert!(!b.is_null());
    b
}

fn field(b: *const stoker_batch, i: usize) -> stoker_tensor {
    let mut t = stoker_tensor::EMPTY;
    assert_eq!(
        stoker_batch_field(b, i, &mut t),
        STOKER_OK,
        "{}",
        last_error()
    );
    t
}

/// Field `t`'s bytes, read back from the fake device (after the copy completed).
fn device_bytes(fake: &FakeDevice, t: &stoker_tensor) -> Vec<u8> {
    let elems: i64 = t.shape[..t.ndim as usize].iter().product();
    let size = match t.dtype {
        stoker_dtype::STOKER_DTYPE_I64 => 8,
        stoker_dtype::STOKER_DTYPE_U8 => 1,
        other => panic!("unexpected dtype {other:?}"),
    };
    fake.read(t.data as u64, elems as usize * size)
        .expect("a live device buffer")
}

fn event_of(b: *const stoker_batch) -> *mut c_void {
    let mut e = std::ptr::dangling_mut::<c_void>();
    assert_eq!(stoker_batch_cuda_event(b, &mut e), STOKER_OK);
    e
}

fn stream_of(b: *const stoker_batch) -> *mut c_void {
    let mut s = std::ptr::dangling_mut::<c_void>();
    assert_eq!(stoker_batch_cuda_stream(b, &mut s), STOKER_OK);
    s
}

fn as_handle(stream: Stream) -> *mut c_void {
    stream.0 as *mut c_void
}

#[test]
fn device_batches_have_cuda_fields_with_the_copied_data() {
    let fake = fake(1);
    let o = options(10, &[("batch_size", "4"), ("device", "cuda:1")]);
    let l = device_loader(&fake, &o);
    let user = fake.create_stream().unwrap();

    let mut start = 0i64;
    loop {
        let mut b = null_mut();
        let status = stoker_loader_next(l, &mut b);
        if status == STOKER_END_OF_EPOCH {
            assert!(b.is_null());
            break;
        }
        assert_eq!(status, STOKER_OK, "{}", last_error());
        let rows = (10 - start).min(4);
        assert_eq!(stoker_batch_num_fields(b), 2);
        assert!(!event_of(b).is_null());
        assert!(!stream_of(b).is_null());
        assert_ne!(stream_of(b), as_handle(user), "the loader's own stream");

        let x = field(b, 0);
        // SAFETY: `name` is NUL-terminated and valid while `b` lives.
        assert_eq!(unsafe { CStr::from_ptr(x.name) }.to_str().unwrap(), "x");
        assert_eq!((x.device_type, x.device_id), (2, 1));
        assert_eq!(x.dtype, stoker_dtype::STOKER_DTYPE_I64);
        assert_eq!((x.ndim, x.shape[0], x.shape[1]), (2, rows, 3));
        assert_eq!((x.strides[0], x.strides[1]), (3, 1));
        let mut y = stoker_tensor::EMPTY;
        let name = CString::new("y").unwrap();
        assert_eq!(
            stoker_batch_field_by_name(b, name.as_ptr(), &mut y),
            STOKER_OK
        );
        assert_eq!((y.device_type, y.device_id, y.ndim), (2, 1, 1));
        assert_eq!(y.shape[0], rows);

        // The caller's stream and the legacy default stream wait for the copy.
        assert_eq!(stoker_batch_wait(b, as_handle(user)), STOKER_OK);
        assert_eq!(stoker_batch_wait(b, null_mut()), STOKER_OK);
        assert_eq!(stoker_batch_synchronize(b), STOKER_OK);
        assert_eq!(device_bytes(&fake, &x), x_bytes(start..start + rows));
        let want_y: Vec<u8> = (start..start + rows).map(|i| i as u8).collect();
        assert_eq!(device_bytes(&fake, &y), want_y);

        let mut t = stoker_tensor::EMPTY;
        assert_eq!(
            stoker_batch_field(b, 2, &mut t),
            STOKER_ERR_INVALID_ARGUMENT
        );
        assert!(t.data.is_null());
        let z = CString::new("z").unwrap();
        assert_eq!(
            stoker_batch_field_by_name(b, z.as_ptr(), &mut t),
            STOKER_ERR_INVALID_ARGUMENT
        );
        assert!(
            last_error().contains("its fields: x, y"),
            "{}",
            last_error()
        );
        stoker_batch_release(b);
        start += rows;
    }
    assert_eq!(start, 10);

    // A batch outlives its loader.
    let b = next(l);
    stoker_loader_free(l);
    assert_eq!(stoker_batch_synchronize(b), STOKER_OK);
    assert_eq!(device_bytes(&fake, &field(b, 0)), x_bytes(0..4));
    stoker_batch_release(b);

    let c = fake.counters();
    assert_eq!((c.live_buffers, c.live_events), (0, 0), "{c:?}");
    assert_eq!(c.live_streams, 1, "only the caller's stream is left: {c:?}");
    // SAFETY: created above, destroyed once; nothing is queued on it any more.
    unsafe { fake.destroy_stream(user) };
    assert!(fake.violations().is_empty(), "{:?}", fake.violations());
}

#[test]
fn releasing_a_batch_returns_its_buffer_to_the_ring() {
    let fake = fake(0);
    // prefetch_factor 1: a ring of 2 device buffers, which the budget does not let grow (one
    // page a batch, 4 pages: the host's 2 and the ring's 2).
    let budget = (4 * stoker_core::arena::page_size()).to_string();
    let o = options(
        16,
        &[
            ("batch_size", "2"),
            ("prefetch_factor", "1"),
            ("memory_budget", &budget),
        ],
    );
    let l = device_loader(&fake, &o);
    let b0 = next(l);
    let b1 = next(l);
    // Both buffers are held: the next call fails instead of waiting forever.
    let mut b = std::ptr::dangling_mut::<stoker_batch>();
    assert_eq!(stoker_loader_next(l, &mut b), STOKER_ERR_INVALID_ARGUMENT);
    assert!(b.is_null());
    assert!(
        last_error().contains("all 2 device buffers"),
        "{}",
        last_error()
    );
    stoker_batch_release(b0);
    let b2 = next(l);
    assert_eq!(stoker_batch_synchronize(b2), STOKER_OK);
    assert_eq!(device_bytes(&fake, &field(b2, 0)), x_bytes(4..6));
    stoker_batch_release(b1);
    stoker_batch_release(b2);
    // Many batches later the same two buffers are still all there is.
    for _ in 0..20 {
        let b = next_or_epoch_end(l);
        stoker_batch_release(b);
    }
    let c = fake.counters();
    assert_eq!((c.allocations, c.max_live_buffers), (2, 2), "{c:?}");
    stoker_loader_free(l);
    let c = fake.counters();
    assert_eq!((c.live_buffers, c.live_events, c.live_streams), (0, 0, 0));
    assert!(fake.violations().is_empty(), "{:?}", fake.violations());
}

/// The next batch, moving past an epoch's end.
fn next_or_epoch_end(l: *mut stoker_loader) -> *mut stoker_batch {
    let mut b = null_mut();
    match stoker_loader_next(l, &mut b) {
        STOKER_OK => b,
        STOKER_END_OF_EPOCH => next(l),
        other => panic!("stoker_loader_next: {other:?}: {}", last_error()),
    }
}

#[test]
fn a_dlpack_export_is_cuda_and_keeps_the_buffer_until_its_deleter_runs() {
    let fake = fake(1);
    // A ring of 2 that the budget does not let grow (see above).
    let budget = (4 * stoker_core::arena::page_size()).to_string();
    let o = options(
        16,
        &[
            ("batch_size", "2"),
            ("prefetch_factor", "1"),
            ("memory_budget", &budget),
        ],
    );
    let l = device_loader(&fake, &o);
    let b0 = next(l);
    let x = field(b0, 0);
    let mut d: *mut DLManagedTensorVersioned = null_mut();
    assert_eq!(stoker_batch_to_dlpack(b0, 0, &mut d), STOKER_OK);
    // SAFETY: the export is live until its deleter runs below.
    let dl = unsafe { (*d).dl_tensor };
    assert_eq!(dl.device.device_type, DLDeviceType::kDLCUDA);
    assert_eq!(dl.device.device_id, 1);
    assert_eq!(dl.data, x.data);
    assert_eq!(dl.ndim, 2);
    // SAFETY: shape and strides hold `ndim` elements while the export lives.
    unsafe {
        assert_eq!((*dl.shape, *dl.shape.add(1)), (2, 3));
        assert_eq!((*dl.strides, *dl.strides.add(1)), (3, 1));
    }
    assert_eq!(stoker_batch_wait(b0, null_mut()), STOKER_OK);
    stoker_batch_release(b0);

    // The export still holds b0's buffer: one buffer is left for b1, none for a third batch.
    let b1 = next(l);
    let mut b = null_mut();
    assert_eq!(stoker_loader_next(l, &mut b), STOKER_ERR_INVALID_ARGUMENT);
    assert!(b.is_null());
    assert_eq!(stoker_batch_synchronize(b1), STOKER_OK);
    // The buffer is live (held by the export) and its copy completed (b1's copy was queued
    // after it on the same stream and has completed).
    let copied = fake.read(dl.data as u64, 2 * 3 * 8).expect("a live buffer");
    assert_eq!(copied, x_bytes(0..2), "not overwritten while exported");

    // SAFETY: the deleter of a live export, called once.
    unsafe { ((*d).deleter.unwrap())(d) };
    let b2 = next(l);
    assert_eq!(stoker_batch_synchronize(b2), STOKER_OK);
    assert_eq!(device_bytes(&fake, &field(b2, 0)), x_bytes(4..6));
    stoker_batch_release(b1);
    stoker_batch_release(b2);
    stoker_loader_free(l);
    let c = fake.counters();
    assert_eq!((c.live_buffers, c.live_events, c.live_streams), (0, 0, 0));
    assert!(fake.violations().is_empty(), "{:?}", fake.violations());
}

#[test]
fn a_failed_copy_is_stoker_err_cuda() {
    let fake = fake(0);
    fake.fail_copy(0, FailAt::Complete);
    let o = options(8, &[("batch_size", "4")]);
    let l = device_loader(&fake, &o);
    // The batch is handed out before its copy runs; the failure shows on its event.
    let b = next(l);
    assert_eq!(stoker_batch_synchronize(b), STOKER_ERR_CUDA);
    let message = last_error();
    assert!(
        message.contains("batch 0 of epoch 0") && message.contains("injected"),
        "{message}"
    );
    assert_eq!(stoker_batch_wait(b, null_mut()), STOKER_ERR_CUDA);
    stoker_batch_release(b);
    // The next batch is fine.
    let b = next(l);
    assert_eq!(stoker_batch_wait(b, null_mut()), STOKER_OK);
    assert_eq!(stoker_batch_synchronize(b), STOKER_OK);
    assert_eq!(device_bytes(&fake, &field(b, 0)), x_bytes(4..8));
    stoker_batch_release(b);
    stoker_loader_free(l);
    assert!(fake.violations().is_empty(), "{:?}", fake.violations());
}

#[test]
fn the_loader_copies_on_the_stream_given_in_the_options() {
    let fake = fake(0);
    let user = fake.create_stream().unwrap();
    let o = into_raw(stoker_options {
        inner: options(8, &[("batch_size", "4"), ("device", "cuda")]),
    });
    assert_eq!(
        stoker_options_set_cuda_stream(o, as_handle(user)),
        STOKER_OK
    );
    // SAFETY: `o` is the live handle made above.
    let inner = unsafe { &(*o).inner };
    assert_eq!(inner.cuda_stream(), Some(user.0));
    let l = device_loader(&fake, inner);
    stoker_options_free(o);
    let b = next(l);
    assert_eq!(stream_of(b), as_handle(user));
    assert_eq!(stoker_batch_wait(b, as_handle(user)), STOKER_OK);
    assert_eq!(stoker_batch_synchronize(b), STOKER_OK);
    assert_eq!(device_bytes(&fake, &field(b, 0)), x_bytes(0..4));
    stoker_batch_release(b);
    stoker_loader_free(l);
    // Borrowed: the loader never destroys it.
    assert_eq!(fake.counters().live_streams, 1);
    // SAFETY: created above, destroyed once; nothing is queued on it any more.
    unsafe { fake.destroy_stream(user) };
}

#[test]
fn host_batches_have_no_event_or_stream_and_wait_is_a_no_op() {
    let o = into_raw(stoker_options {
        inner: options(6, &[("batch_size", "4")]),
    });
    let mut l = null_mut();
    assert_eq!(stoker_loader_new(o, &mut l), STOKER_OK, "{}", last_error());
    stoker_options_free(o);
    let b = next(l);
    assert!(event_of(b).is_null());
    assert!(stream_of(b).is_null());
    assert_eq!(stoker_batch_wait(b, 0x1234 as *mut c_void), STOKER_OK);
    assert_eq!(stoker_batch_synchronize(b), STOKER_OK);
    let x = field(b, 0);
    assert_eq!((x.device_type, x.device_id), (1, 0));
    let mut d: *mut DLManagedTensorVersioned = null_mut();
    assert_eq!(stoker_batch_to_dlpack(b, 0, &mut d), STOKER_OK);
    // SAFETY: a live export, deleted once.
    unsafe {
        assert_eq!((*d).dl_tensor.device.device_type, DLDeviceType::kDLCPU);
        assert_eq!((*d).dl_tensor.device.device_id, 0);
        ((*d).deleter.unwrap())(d);
    }
    stoker_batch_release(b);
    stoker_loader_free(l);
}

#[test]
fn cuda_functions_reject_null_arguments() {
    let fake = fake(0);
    let o = options(4, &[("batch_size", "2")]);
    let l = device_loader(&fake, &o);
    let b = next(l);
    let mut p = std::ptr::dangling_mut::<c_void>();
    assert_eq!(
        stoker_batch_cuda_event(null(), &mut p),
        STOKER_ERR_INVALID_ARGUMENT
    );
    assert!(p.is_null(), "cleared on failure");
    assert!(last_error().contains("stoker_batch_cuda_event: argument `b` is NULL"));
    assert_eq!(
        stoker_batch_cuda_event(b, null_mut()),
        STOKER_ERR_INVALID_ARGUMENT
    );
    assert!(last_error().contains("argument `event_out` is NULL"));
    p = std::ptr::dangling_mut::<c_void>();
    assert_eq!(
        stoker_batch_cuda_stream(null(), &mut p),
        STOKER_ERR_INVALID_ARGUMENT
    );
    assert!(p.is_null(), "cleared on failure");
    assert_eq!(
        stoker_batch_cuda_stream(b, null_mut()),
        STOKER_ERR_INVALID_ARGUMENT
    );
    assert!(last_error().contains("argument `stream_out` is NULL"));
    assert_eq!(
        stoker_batch_wait(null_mut(), null_mut()),
        STOKER_ERR_INVALID_ARGUMENT
    );
    assert!(last_error().contains("stoker_batch_wait: argument `b` is NULL"));
    assert_eq!(
        stoker_batch_synchronize(null_mut()),
        STOKER_ERR_INVALID_ARGUMENT
    );
    assert_eq!(
        stoker_options_set_cuda_stream(null_mut(), null_mut()),
        STOKER_ERR_INVALID_ARGUMENT
    );
    assert!(last_error().contains("stoker_options_set_cuda_stream: argument `o` is NULL"));
    // Still usable.
    assert_eq!(stoker_batch_synchronize(b), STOKER_OK);
    stoker_batch_release(b);
    stoker_loader_free(l);
}

#[test]
fn gpu_normalize_delivers_float_fields_through_the_c_abi_with_uint8_across() {
    use stoker_core::{DType, MemorySource};
    // Eight RGB uint8 images of 4x3, normalized to float32 NCHW.
    let (n, h, w) = (8usize, 4usize, 3usize);
    let pixels: Vec<u8> = (0..n * h * w * 3).map(|i| (i * 29 % 256) as u8).collect();
    let source = MemorySource::new()
        .with_tensor("image", DType::U8, &[h, w, 3], pixels)
        .unwrap();
    let mut o = LoaderOptions::new().with_source(SourceSpec::Custom(Arc::new(source)));
    for (k, v) in [("batch_size", "4"), ("transform", "normalize(imagenet)")] {
        o.set(k, v).unwrap();
    }
    let mut cpu = Loader::new(&o).unwrap();
    let fake = fake(0);
    let l = device_loader(&fake, &o);
    for _ in 0..2 {
        let b = next(l);
        assert_eq!(stoker_batch_synchronize(b), STOKER_OK);
        let t = field(b, 0);
        assert_eq!(t.device_type, 2);
        assert_eq!(t.dtype, stoker_dtype::STOKER_DTYPE_F32);
        assert_eq!(&t.shape[..4], &[4, 3, h as i64, w as i64]);
        let host = cpu.next().unwrap().unwrap();
        let want = host.field(0).unwrap().data.unwrap().to_vec();
        assert_eq!(fake.read(t.data as u64, want.len()).unwrap(), want);
        stoker_batch_release(b);
    }
    let mut stats = stoker_stats {
        size: std::mem::size_of::<stoker_stats>() as u64,
        ..Default::default()
    };
    assert_eq!(stoker_loader_stats(l, &mut stats), STOKER_OK);
    assert!(stats.device_memory_bytes > 0);
    stoker_loader_free(l);
    // Every batch copied (the two delivered, and any the prefetch thread ran ahead with) crossed
    // as its uint8 image and its table, never as float32.
    let c = fake.counters();
    assert!(c.casts_done >= 2);
    assert_eq!(
        c.bytes_copied,
        c.casts_done * (4 * h * w * 3 + 3 * 256 * 4) as u64
    );
    assert_eq!(c.live_bytes, 0);
}

#[test]
fn gpu_decode_delivers_device_decoded_images_through_the_c_abi() {
    // An image folder of two classes of a baseline JPEG the device takes.
    let root = std::env::temp_dir().join(format!("stoker-capi-gpu-decode-{}", std::process::id()));
    let photo = std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../stoker-core/tests/data/images/photo_baseline.jpg"),
    )
    .unwrap();
    for class in ["a", "b"] {
        std::fs::create_dir_all(root.join(class)).unwrap();
        for i in 0..4 {
            std::fs::write(root.join(class).join(format!("{i}.jpg")), &photo).unwrap();
        }
    }
    let mut o = LoaderOptions::new();
    for (k, v) in [
        (
            "source",
            format!("image_folder:{}", root.display()).as_str(),
        ),
        ("batch_size", "4"),
        (
            "transform",
            "random_resized_crop(16) | hflip | normalize(imagenet)",
        ),
        ("dtype", "float32"),
    ] {
        o.set(k, v).unwrap();
    }
    let mut cpu = Loader::new(&o).unwrap();
    o.set("jpeg_decoder", "gpu").unwrap();
    let fake = fake(0);
    let l = device_loader(&fake, &o);
    for _ in 0..2 {
        let b = next(l);
        assert_eq!(stoker_batch_synchronize(b), STOKER_OK);
        let t = field(b, 0);
        assert_eq!(t.device_type, 2);
        assert_eq!(t.dtype, stoker_dtype::STOKER_DTYPE_F32);
        let host = cpu.next().unwrap().unwrap();
        let want = host.field(0).unwrap().data.unwrap().to_vec();
        let got = fake.read(t.data as u64, want.len()).unwrap();
        // Within a few levels of the CPU path (the fake decodes with the CPU's decoder): 11 at
        // most here, where the CPU shrinks a 16-pixel crop in the DCT domain.
        let floats = |b: &[u8]| -> Vec<f32> {
            b.chunks_exact(4)
                .map(|w| f32::from_ne_bytes([w[0], w[1], w[2], w[3]]))
                .collect()
        };
        let worst = floats(&got)
            .iter()
            .zip(floats(&want))
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(worst <= 16.0 / 255.0 / 0.229, "{worst}");
        stoker_batch_release(b);
    }
    let mut stats = stoker_stats {
        size: std::mem::size_of::<stoker_stats>() as u64,
        ..Default::default()
    };
    assert_eq!(stoker_loader_stats(l, &mut stats), STOKER_OK);
    assert!(stats.decoded_device >= 8, "{}", stats.decoded_device);
    assert_eq!(stats.gpu_decode_share, 1.0);
    stoker_loader_free(l);
    assert!(fake.counters().jpegs_decoded >= 8);
    assert_eq!(fake.counters().live_bytes, 0);
    let _ = std::fs::remove_dir_all(&root);
}
