//! Device batches through the bridge, against the core's host-memory `FakeDevice`: the C++ API
//! has no way to inject a device (and gets none added for tests), so these tests wrap a loader
//! made with `Loader::with_device_backend` in the bridge's `LoaderHandle` (what `loader_new`
//! makes) and call the same methods `stoker.hpp` calls. The GoogleTest suite covers what a
//! machine without CUDA can check from C++.

use std::sync::Arc;
use std::time::Duration;

use stoker_core::testing::{counting_source, FailAt, FakeDevice};
use stoker_core::{DeviceBackend, Loader, LoaderOptions, SourceSpec};

use super::*;

fn x_bytes(rows: std::ops::Range<i64>) -> Vec<u8> {
    rows.flat_map(|i| [i, i + 1, i + 2])
        .flat_map(|v| v.to_ne_bytes())
        .collect()
}

/// Options as the C++ `stoker::Options` would build them, through the bridge's `set`.
fn options(n: usize, kv: &[(&str, &str)]) -> LoaderOptions {
    let mut o = options_new();
    o.0.set_source(SourceSpec::Custom(counting_source(n)));
    o.set(b"num_workers", b"1").unwrap();
    for (k, v) in kv {
        o.set(k.as_bytes(), v.as_bytes()).unwrap();
    }
    o.0
}

fn fake(ordinal: u32) -> Arc<FakeDevice> {
    let f = FakeDevice::new(ordinal).unwrap();
    // Copies complete later, on the fake's thread: reading too early shows.
    f.set_copy_delay(Duration::from_millis(2));
    f
}

fn device_loader(fake: &Arc<FakeDevice>, o: &LoaderOptions) -> LoaderHandle {
    LoaderHandle(Loader::with_device_backend(o, fake.clone()).unwrap())
}

fn bytes_of(fake: &FakeDevice, f: &FieldInfo, elem: usize) -> Vec<u8> {
    let n: i64 = f.shape.iter().product();
    fake.read(f.data as u64, n as usize * elem)
        .expect("a live device buffer")
}

#[test]
fn device_batches_have_cuda_fields_with_the_copied_data() {
    let fake = fake(1);
    let o = options(10, &[("batch_size", "4"), ("device", "cuda:1")]);
    let mut l = device_loader(&fake, &o);
    let user = fake.create_stream().unwrap();

    for epoch in 0..2u64 {
        let mut start = 0i64;
        loop {
            let b = l.next().unwrap();
            if b.is_end() {
                assert!(b.fields().is_empty());
                assert_eq!((b.cuda_stream(), b.cuda_event()), (0, 0));
                break;
            }
            let rows = (10 - start).min(4);
            assert_eq!(b.len(), rows as usize);
            assert_eq!(b.epoch(), epoch);
            assert_eq!(b.position(), (start / 4) as usize);
            assert_ne!(b.cuda_stream(), 0);
            assert_ne!(b.cuda_event(), 0);
            assert_ne!(b.cuda_stream(), user.0, "the loader's own stream");
            b.wait(user.0).unwrap();
            b.synchronize().unwrap();

            let fields = b.fields();
            assert_eq!(fields.len(), 2);
            let (x, y) = (&fields[0], &fields[1]);
            assert_eq!((x.name.as_str(), y.name.as_str()), ("x", "y"));
            for f in &fields {
                assert_eq!(f.device_type, 2, "kDLCUDA");
                assert_eq!(f.device_id, 1);
                assert_ne!(f.data, 0);
            }
            assert_eq!(x.dtype, DType::I64 as u32);
            assert_eq!(x.shape, vec![rows, 3]);
            assert_eq!(x.strides, vec![3, 1]);
            assert_eq!(y.shape, vec![rows]);
            assert_eq!(bytes_of(&fake, x, 8), x_bytes(start..start + rows));
            let want: Vec<u8> = (start..start + rows).map(|i| i as u8).collect();
            assert_eq!(bytes_of(&fake, y, 1), want);
            start += rows;
            // `b` drops here: its buffer goes back to the ring (2 buffers: 3 batches per epoch
            // would run out otherwise).
        }
        assert_eq!(start, 10);
        assert_eq!(l.epoch(), epoch + 1);
    }
    drop(l);
    let c = fake.counters();
    assert_eq!(c.live_buffers, 0, "every buffer freed: {c:?}");
    assert!(c.max_live_buffers <= 3, "{c:?}");
    // SAFETY: created above, destroyed once; nothing is queued on it any more.
    unsafe { fake.destroy_stream(user) };
    assert!(fake.violations().is_empty(), "{:?}", fake.violations());
}

#[test]
fn a_held_batch_keeps_its_buffer_until_released() {
    let fake = fake(0);
    // prefetch_factor 1: a ring of 2 device buffers, which the budget does not let grow (one
    // page a batch, 4 pages: the host's 2 and the ring's 2).
    let budget = (4 * stoker_core::arena::page_size()).to_string();
    let o = options(
        12,
        &[
            ("batch_size", "4"),
            ("prefetch_factor", "1"),
            ("memory_budget", &budget),
        ],
    );
    let mut l = device_loader(&fake, &o);
    let a = l.next().unwrap();
    let b = l.next().unwrap();
    // The ring (prefetch_factor + 1 = 2 buffers) is all held and may not grow: asking again
    // fails at once.
    let e = l.next().err().expect("the ring is exhausted");
    assert!(e.to_string().starts_with("-1|"), "{e}");
    a.synchronize().unwrap();
    let x = &a.fields()[0];
    assert_eq!(bytes_of(&fake, x, 8), x_bytes(0..4));
    drop(l);
    // The batches outlive the loader; their buffers are freed when they are dropped.
    assert!(fake.counters().live_buffers >= 2);
    b.synchronize().unwrap();
    assert_eq!(bytes_of(&fake, &b.fields()[0], 8), x_bytes(4..8));
    drop((a, b));
    assert_eq!(fake.counters().live_buffers, 0, "{:?}", fake.counters());
    assert!(fake.violations().is_empty(), "{:?}", fake.violations());
}

#[test]
fn a_failed_copy_is_status_cuda() {
    let fake = fake(0);
    fake.fail_copy(0, FailAt::Complete);
    let o = options(8, &[("batch_size", "4")]);
    let mut l = device_loader(&fake, &o);
    let b = l.next().unwrap();
    let e = b.synchronize().unwrap_err();
    assert!(e.to_string().starts_with("-10|"), "{e}");
    assert!(e.to_string().contains("injected"), "{e}");
    let e = b.wait(0).unwrap_err();
    assert!(e.to_string().starts_with("-10|"), "{e}");
    drop(b);
    let b = l.next().unwrap();
    b.wait(0).unwrap();
    b.synchronize().unwrap();
    assert_eq!(bytes_of(&fake, &b.fields()[0], 8), x_bytes(4..8));
}

#[test]
fn the_copy_runs_on_the_cuda_stream_option() {
    let fake = fake(0);
    let user = fake.create_stream().unwrap();
    // What `stoker::Options::cuda_stream(void*)` sets: the address in decimal.
    let o = options(
        8,
        &[("batch_size", "4"), ("cuda_stream", &user.0.to_string())],
    );
    let mut l = device_loader(&fake, &o);
    let b = l.next().unwrap();
    assert_eq!(b.cuda_stream(), user.0);
    b.synchronize().unwrap();
    drop((b, l));
    // SAFETY: created above, destroyed once; nothing is queued on it any more.
    unsafe { fake.destroy_stream(user) };
    assert!(fake.violations().is_empty(), "{:?}", fake.violations());
}

#[test]
fn host_batches_have_no_stream_and_wait_is_a_no_op() {
    let o = options(8, &[("batch_size", "4")]);
    let mut l = LoaderHandle(Loader::new(&o).unwrap());
    let b = l.next().unwrap();
    assert_eq!((b.cuda_stream(), b.cuda_event()), (0, 0));
    b.wait(0).unwrap();
    b.wait(12345).unwrap();
    b.synchronize().unwrap();
    assert!(b.fields().iter().all(|f| f.device_type != 2));
}

#[test]
fn device_cuda_without_a_driver_is_unsupported() {
    let o = options(8, &[("device", "cuda")]);
    match loader_new(&OptionsHandle(o)) {
        // A machine with a GPU: nothing to check here.
        Ok(_) => {}
        Err(e) => assert!(e.to_string().starts_with("-4|"), "{e}"),
    }
}
