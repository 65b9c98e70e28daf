//! The CUDA prefetch path against the host-memory fake device: ordering, the ring bound,
//! backpressure, early recycling of host slabs, copy errors, shutdown. The fake runs copies later
//! on its own thread, so a prefetcher that frees, reuses or reads too early fails these tests.

use std::sync::Arc;
use std::time::Duration;

use stoker_core::testing::{FailAt, FakeDevice};
use stoker_core::Stream;
use stoker_core::{Batch, DType, DeviceType, Error, ErrorKind, Loader, LoaderOptions, Source};

use crate::support::counting_source;

/// Options for a CUDA loader over `source`.
fn options(source: Arc<dyn Source>, kv: &[(&str, &str)]) -> LoaderOptions {
    let mut o = crate::support::options(source, &[("device", "cuda")]);
    for (k, v) in kv {
        o.set(k, v).unwrap();
    }
    o
}

fn fake(delay_ms: u64) -> Arc<FakeDevice> {
    let f = FakeDevice::new(0).unwrap();
    f.set_copy_delay(Duration::from_millis(delay_ms));
    f
}

fn device_loader(fake: &Arc<FakeDevice>, o: &LoaderOptions) -> Loader {
    Loader::with_device_backend(o, fake.clone()).unwrap()
}

/// Every field of a device batch as bytes, read back from the fake once the copy completed.
fn contents(fake: &FakeDevice, b: &Batch) -> Vec<Vec<u8>> {
    b.synchronize().unwrap();
    (0..b.num_fields())
        .map(|i| {
            let meta = b.field_meta(i).unwrap();
            fake.read(b.field(i).unwrap().address, meta.num_bytes())
                .unwrap()
        })
        .collect()
}

/// Waits until `cond` holds (the prefetch thread works concurrently), failing after 5 s.
fn eventually(what: &str, cond: impl FnMut() -> bool) {
    stoker_core::testing::eventually(what, Duration::from_secs(5), cond);
}

#[test]
fn device_batches_match_host_batches_in_order_across_epochs() {
    let kv = [
        ("batch_size", "4"),
        ("num_workers", "2"),
        ("shuffle", "true"),
        ("seed", "7"),
    ];
    let fake = fake(1);
    let mut dev = device_loader(&fake, &options(counting_source(10), &kv));
    let mut cpu_options = options(counting_source(10), &kv);
    cpu_options.set("device", "cpu").unwrap();
    let mut cpu = Loader::new(&cpu_options).unwrap();
    assert_eq!(dev.device().to_string(), "cuda:0");
    for epoch in 0..2 {
        for position in 0..3 {
            let h = cpu.next().unwrap().unwrap();
            let d = dev.next().unwrap().unwrap();
            assert_eq!(
                (d.epoch(), d.position(), d.len()),
                (epoch, position, h.len())
            );
            assert_eq!(d.device_type(), DeviceType::Cuda);
            assert_eq!(d.device_id(), 0);
            let host: Vec<Vec<u8>> = h.fields().map(|f| f.data.unwrap().to_vec()).collect();
            assert_eq!(contents(&fake, &d), host, "epoch {epoch} batch {position}");
            let field = d.field_by_name("x").unwrap();
            assert_eq!((field.dtype, field.shape), (DType::I64, &[h.len(), 3][..]));
            assert_eq!(dev.position(), position + 1);
        }
        assert!(cpu.next().unwrap().is_none());
        assert!(dev.next().unwrap().is_none(), "end of epoch {epoch}");
        assert_eq!(dev.epoch(), epoch + 1);
    }
    assert_eq!(dev.stats().batches, 6);
    assert!(fake.violations().is_empty(), "{:?}", fake.violations());
}

#[test]
fn copies_of_consecutive_batches_overlap_and_deliver_the_right_bytes() {
    // Copies slower than building: the prefetcher queues the next batch's copies behind the
    // running ones instead of waiting for them first.
    let kv = [
        ("batch_size", "4"),
        ("num_workers", "2"),
        ("prefetch_factor", "4"),
    ];
    let fake = fake(15);
    let mut dev = device_loader(&fake, &options(counting_source(48), &kv));
    let mut cpu_options = options(counting_source(48), &kv);
    cpu_options.set("device", "cpu").unwrap();
    let mut cpu = Loader::new(&cpu_options).unwrap();
    let mut held = Vec::new();
    while let Some(d) = dev.next().unwrap() {
        let h = cpu.next().unwrap().unwrap();
        let host: Vec<Vec<u8>> = h.fields().map(|f| f.data.unwrap().to_vec()).collect();
        assert_eq!(contents(&fake, &d), host, "batch {}", d.position());
        held.push(d);
        if held.len() > 2 {
            held.remove(0); // a trainer keeping the last two alive
        }
    }
    let fields = 2; // x and y: two copies a batch
    let pending = fake.counters().max_copies_pending;
    assert!(
        pending > fields,
        "at most {pending} copies were queued at once: one batch's, never the next's behind it"
    );
    drop(held);
    drop(dev);
    assert!(fake.violations().is_empty(), "{:?}", fake.violations());
}

#[test]
fn the_ring_bounds_live_device_buffers_and_reuses_them() {
    let fake = fake(0);
    // prefetch_factor 2: a ring of 3 buffers.
    let o = options(
        counting_source(64),
        &[
            ("batch_size", "4"),
            ("num_workers", "2"),
            ("prefetch_factor", "2"),
        ],
    );
    let mut l = device_loader(&fake, &o);
    let mut held = Vec::new();
    for _ in 0..16 {
        let b = l.next().unwrap().unwrap();
        held.push(b);
        if held.len() == 2 {
            held.remove(0); // the trainer keeps the previous batch while using the next
        }
        assert!(fake.counters().live_buffers <= 3);
    }
    let c = fake.counters();
    assert!(c.max_live_buffers <= 3, "{c:?}");
    assert_eq!(
        c.allocations, c.max_live_buffers as u64,
        "buffers are reused, not reallocated"
    );
    drop(held);
    drop(l);
    assert!(fake.violations().is_empty(), "{:?}", fake.violations());
}

#[test]
fn holding_every_buffer_the_budget_allows_blocks_the_prefetcher_and_releasing_one_unblocks_it() {
    let fake = fake(0);
    // prefetch_factor 1: a ring of 2 buffers; 2 fields, so 2 copies per batch. Batches of one
    // page: a budget of 4 holds the host's 2 (the cap and the one being copied) and the ring's
    // 2, so the ring cannot grow.
    let o = options(
        counting_source(40),
        &[
            ("batch_size", "2"),
            ("num_workers", "1"),
            ("prefetch_factor", "1"),
            (
                "memory_budget",
                &(4 * stoker_core::arena::page_size()).to_string(),
            ),
        ],
    );
    let mut l = device_loader(&fake, &o);
    let first = l.next().unwrap().unwrap();
    let second = l.next().unwrap().unwrap();
    eventually("two batches copied", || fake.counters().copies_done == 4);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        fake.counters().copies_done,
        4,
        "the prefetcher waits for a free buffer"
    );
    // Asking for a third while holding the whole ring fails at once instead of hanging.
    let err = l.next().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(
        err.to_string().contains("held by batches not yet released")
            && err.to_string().contains("memory_budget"),
        "{err}"
    );
    drop(first);
    let third = l.next().unwrap().unwrap();
    assert_eq!(third.position(), 2, "the failed call consumed nothing");
    assert_eq!(contents(&fake, &third)[1], vec![4, 5]);
    drop((second, third));
    assert!(fake.violations().is_empty(), "{:?}", fake.violations());
}

#[test]
fn a_trainer_holding_more_batches_than_the_ring_grows_it_within_the_budget_and_it_shrinks_back() {
    let fake = fake(0);
    let page = stoker_core::arena::page_size();
    // A ring of 2 (prefetch_factor 1) and batches of one page; the budget holds the host's
    // (the one in flight, and those the prefetcher copies from) and 5 device buffers.
    let host = 1 + stoker_core::cuda::COPIES_IN_FLIGHT;
    let o = options(
        counting_source(400),
        &[
            ("batch_size", "2"),
            ("num_workers", "1"),
            ("prefetch_factor", "1"),
            ("memory_budget", &((host + 5) * page).to_string()),
        ],
    );
    let mut l = device_loader(&fake, &o);
    let held: Vec<Batch> = (0..5).map(|_| l.next().unwrap().unwrap()).collect();
    for (i, b) in held.iter().enumerate() {
        assert_eq!(b.position(), i);
        assert_eq!(contents(&fake, b)[1], vec![2 * i as u8, 2 * i as u8 + 1]);
    }
    assert_eq!(fake.counters().live_buffers, 5);
    // The sixth does not fit: the error says which option would make room.
    let err = l.next().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(
        err.to_string().contains("all 5 device buffers")
            && err.to_string().contains("memory_budget"),
        "{err}"
    );
    drop(held);
    // Once the trainer holds one batch at a time, the buffers the ring grew by are freed.
    for position in 5..12 {
        let b = l.next().unwrap().unwrap();
        assert_eq!(b.position(), position, "the failed call consumed nothing");
    }
    eventually("the ring shrank back to 2 buffers", || {
        fake.counters().live_buffers <= 2
    });
    drop(l);
    assert!(fake.violations().is_empty(), "{:?}", fake.violations());
}

#[test]
fn holding_the_whole_ring_still_sees_the_end_of_the_epoch() {
    let fake = fake(0);
    // A ring of 2 that the budget does not let grow (see above) and an epoch of 2 batches:
    // both held, the end of the epoch still arrives.
    let o = options(
        counting_source(4),
        &[
            ("batch_size", "2"),
            ("num_workers", "1"),
            ("prefetch_factor", "1"),
            (
                "memory_budget",
                &(4 * stoker_core::arena::page_size()).to_string(),
            ),
        ],
    );
    let mut l = device_loader(&fake, &o);
    for _ in 0..20 {
        let a = l.next().unwrap().unwrap();
        let b = l.next().unwrap().unwrap();
        assert!(l.next().unwrap().is_none());
        let err = l.next().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
        drop((a, b));
    }
}

#[test]
fn host_slabs_are_recycled_once_copied_while_device_batches_are_held() {
    let fake = fake(20);
    // num_workers 0: host batches are built on the prefetch thread, so every leased slab is one
    // the prefetcher holds: those of its copies in flight and the batch it builds next.
    let o = options(
        counting_source(40),
        &[
            ("batch_size", "4"),
            ("num_workers", "0"),
            ("prefetch_factor", "1"),
        ],
    );
    let mut l = device_loader(&fake, &o);
    let a = l.next().unwrap().unwrap();
    let b = l.next().unwrap().unwrap();
    // Both device batches are held; their host slabs are not: once both copies are done, only
    // the prefetcher's own batches keep slabs (the next one's copy may still run while the one
    // after it is built), and once it waits for a buffer, only the batch built next.
    eventually("both copies done", || fake.counters().copies_done == 4);
    eventually("host slabs of held device batches recycled", || {
        l.arena().counters().slabs_leased == 1
    });
    std::thread::sleep(Duration::from_millis(50));
    let leased = l.arena().counters().slabs_leased;
    assert!(
        leased <= stoker_core::cuda::COPIES_IN_FLIGHT as u64,
        "{leased} slabs leased: held device batches keep none"
    );
    assert!(
        a.is_ready().unwrap() && b.is_ready().unwrap(),
        "both copies completed"
    );
    drop((a, b));
    // A whole epoch while always holding the previous batch maps no more than the pipeline needs.
    let mut prev = None;
    while let Some(batch) = l.next().unwrap() {
        prev = Some(batch);
    }
    drop(prev);
    let c = l.arena().counters();
    assert!(c.slabs_mapped <= 2, "slabs are reused: {c:?}");
    assert!(
        fake.counters().live_registrations >= 1,
        "pin_memory registers slabs"
    );
    drop(l);
    assert_eq!(
        fake.counters().live_registrations,
        0,
        "unregistered before unmap"
    );
    assert!(fake.violations().is_empty(), "{:?}", fake.violations());
}

#[test]
fn a_copy_failing_when_queued_names_its_batch_and_the_loader_goes_on() {
    let fake = fake(0);
    // Copies are numbered from 0, two per batch: copy 3 is field `y` of batch 1.
    fake.fail_copy(3, FailAt::Enqueue);
    let o = options(
        counting_source(12),
        &[("batch_size", "4"), ("num_workers", "1")],
    );
    let mut l = device_loader(&fake, &o);
    assert_eq!(l.next().unwrap().unwrap().position(), 0);
    let err = l.next().unwrap_err();
    assert!(matches!(err, Error::Cuda(_)), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("batch 1 of epoch 0") && msg.contains("field `y`"),
        "{msg}"
    );
    let next = l.next().unwrap().unwrap();
    assert_eq!(next.position(), 2);
    assert_eq!(contents(&fake, &next)[1], vec![8, 9, 10, 11]);
    assert!(l.next().unwrap().is_none());
    drop((next, l));
    assert_eq!(fake.counters().live_buffers, 0);
}

#[test]
fn a_copy_failing_on_the_device_is_reported_by_its_batch() {
    let fake = fake(5);
    fake.fail_copy(2, FailAt::Complete); // field `x` of batch 1
    let o = options(
        counting_source(12),
        &[("batch_size", "4"), ("num_workers", "1")],
    );
    let mut l = device_loader(&fake, &o);
    let first = l.next().unwrap().unwrap();
    first.synchronize().unwrap();
    let second = l.next().unwrap().unwrap();
    let err = second.synchronize().unwrap_err();
    assert!(matches!(err, Error::Cuda(_)), "{err:?}");
    assert!(err.to_string().contains("batch 1 of epoch 0"), "{err}");
    assert!(second.wait(Stream::DEFAULT).is_err(), "wait reports it too");
    drop((first, second, l));
    assert_eq!(fake.counters().live_buffers, 0);
}

#[test]
fn dropping_mid_epoch_joins_and_frees_every_buffer_after_held_batches_go() {
    let fake = fake(2);
    let o = options(
        counting_source(400),
        &[
            ("batch_size", "4"),
            ("num_workers", "2"),
            ("prefetch_factor", "3"),
        ],
    );
    let mut l = device_loader(&fake, &o);
    let held = l.next().unwrap().unwrap();
    held.wait(Stream::DEFAULT).unwrap();
    let _ = l.next().unwrap().unwrap(); // released at once
    eventually("the prefetcher filled the ring", || {
        fake.counters().live_buffers >= 3
    });
    drop(l); // returns only once the prefetch thread and the pool are joined
    let c = fake.counters();
    assert_eq!(
        c.live_buffers, 1,
        "only the held batch's buffer is left: {c:?}"
    );
    // The held batch stays valid after its loader is gone.
    assert_eq!(contents(&fake, &held)[1], vec![0, 1, 2, 3]);
    drop(held);
    let c = fake.counters();
    assert_eq!(
        (
            c.live_buffers,
            c.live_events,
            c.live_streams,
            c.live_registrations
        ),
        (0, 0, 0, 0),
        "{c:?}"
    );
    assert!(fake.violations().is_empty(), "{:?}", fake.violations());
}

#[test]
fn a_borrowed_stream_is_copied_on_and_never_destroyed() {
    let fake = fake(0);
    use stoker_core::DeviceBackend;
    let mine = fake.create_stream().unwrap();
    let mut o = options(
        counting_source(8),
        &[("batch_size", "4"), ("num_workers", "1")],
    );
    o.set("cuda_stream", &format!("{:#x}", mine.0)).unwrap();
    let mut l = device_loader(&fake, &o);
    let b = l.next().unwrap().unwrap();
    assert_eq!(b.cuda_stream(), Some(mine));
    drop((b, l));
    assert_eq!(
        fake.counters().live_streams,
        1,
        "the caller's stream is left alone"
    );
}

#[test]
fn release_after_wait_orders_reuse_after_the_consumer_stream() {
    let fake = fake(1);
    use stoker_core::DeviceBackend;
    let consumer = fake.create_stream().unwrap();
    let o = options(
        counting_source(40),
        &[
            ("batch_size", "2"),
            ("num_workers", "1"),
            ("prefetch_factor", "1"),
        ],
    );
    let mut l = device_loader(&fake, &o);
    let mut seen = Vec::new();
    while let Some(b) = l.next().unwrap() {
        b.wait(consumer).unwrap();
        b.wait(consumer).unwrap(); // idempotent
        seen.push(b.position());
        assert_eq!(
            contents(&fake, &b)[1],
            vec![2 * b.position() as u8, 2 * b.position() as u8 + 1]
        );
    }
    assert_eq!(seen, (0..20).collect::<Vec<_>>());
    drop(l);
    let c = fake.counters();
    assert_eq!(
        (c.live_buffers, c.live_events, c.live_streams),
        (0, 0, 1),
        "{c:?}"
    );
    assert!(fake.violations().is_empty(), "{:?}", fake.violations());
}

#[test]
fn save_state_counts_delivered_batches_not_prefetched_ones() {
    let fake = fake(0);
    let kv = [
        ("batch_size", "2"),
        ("num_workers", "2"),
        ("shuffle", "true"),
    ];
    let mut l = device_loader(&fake, &options(counting_source(20), &kv));
    let b0 = l.next().unwrap().unwrap();
    let b1 = l.next().unwrap().unwrap();
    eventually("the prefetcher ran ahead", || {
        fake.counters().copies_done >= 6
    });
    assert_eq!(l.position(), 2);
    let state = l.save_state();
    assert!(state.contains("consumed=4;"), "{state}");
    let expected = l.next().unwrap().unwrap();
    let mut resumed_options = options(counting_source(20), &kv);
    resumed_options.set("device", "cpu").unwrap();
    resumed_options.set("resume_state", &state).unwrap();
    let mut resumed = Loader::new(&resumed_options).unwrap();
    let host = resumed.next().unwrap().unwrap();
    assert_eq!(
        contents(&fake, &expected)[1],
        host.field(1).unwrap().data.unwrap()
    );
    drop((b0, b1));
}

#[test]
fn one_next_delivers_both_kinds_of_batch() {
    let fake = fake(0);
    let o = options(counting_source(4), &[("num_workers", "1")]);
    let mut dev = device_loader(&fake, &o);
    let d = dev.next().unwrap().unwrap();
    assert!(d.is_device());
    assert_eq!(d.device_type(), DeviceType::Cuda);
    assert!(
        d.field(0).unwrap().data.is_none(),
        "device bytes are not host slices"
    );
    assert!(d.cuda_stream().is_some() && d.cuda_event().is_some());
    let mut cpu_options = o.clone();
    cpu_options.set("device", "cpu").unwrap();
    let mut cpu = Loader::new(&cpu_options).unwrap();
    let host = cpu.next().unwrap().unwrap();
    assert!(!host.is_device());
    assert_eq!(host.device_type(), DeviceType::Cpu);
    assert_eq!((host.cuda_stream(), host.cuda_event()), (None, None));
    host.wait(stoker_core::Stream(0)).unwrap();
    host.synchronize().unwrap();
    assert_eq!(
        contents(&fake, &d),
        host.fields()
            .map(|f| f.data.unwrap().to_vec())
            .collect::<Vec<_>>()
    );
}

#[test]
fn without_pin_memory_slabs_are_not_registered() {
    let fake = fake(0);
    let o = options(
        counting_source(8),
        &[
            ("batch_size", "4"),
            ("num_workers", "1"),
            ("pin_memory", "false"),
        ],
    );
    let mut l = device_loader(&fake, &o);
    let b = l.next().unwrap().unwrap();
    assert_eq!(contents(&fake, &b)[1], vec![0, 1, 2, 3]);
    assert_eq!(fake.counters().live_registrations, 0);
}

#[test]
fn a_consumer_timeout_consumes_nothing() {
    struct Slow(Arc<dyn Source>);
    impl Source for Slow {
        fn len(&self) -> usize {
            self.0.len()
        }
        fn fields(&self) -> &[stoker_core::FieldSpec] {
            self.0.fields()
        }
        fn describe(&self, i: usize) -> String {
            self.0.describe(i)
        }
        fn read<'a>(
            &'a self,
            i: usize,
            s: &'a mut Vec<u8>,
        ) -> stoker_core::Result<stoker_core::Sample<'a>> {
            std::thread::sleep(Duration::from_millis(150));
            self.0.read(i, s)
        }
    }
    let fake = fake(0);
    let o = options(
        Arc::new(Slow(counting_source(4))),
        &[
            ("batch_size", "1"),
            ("num_workers", "1"),
            ("timeout_ms", "30"),
        ],
    );
    let mut l = device_loader(&fake, &o);
    let err = l.next().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    eventually(
        "the batch arrives later",
        || matches!(l.next(), Ok(Some(b)) if b.position() == 0),
    );
}

#[test]
fn loaders_and_device_batches_move_between_threads() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Batch>();
    send::<Loader>();
    // A batch released on another thread than the one that received it.
    let fake = fake(0);
    let o = options(
        counting_source(8),
        &[("batch_size", "4"), ("num_workers", "1")],
    );
    let mut l = device_loader(&fake, &o);
    let b = l.next().unwrap().unwrap();
    std::thread::spawn(move || drop(b)).join().unwrap();
    assert_eq!(l.next().unwrap().unwrap().position(), 1);
}

#[test]
fn set_epoch_on_a_device_loader_drops_what_was_copied_ahead() {
    let fake = fake(1);
    let kv = [
        ("batch_size", "4"),
        ("num_workers", "2"),
        ("prefetch_factor", "3"),
        ("shuffle", "true"),
    ];
    let host_epoch = |epoch: u64| {
        let mut o = options(counting_source(40), &kv);
        o.set("device", "cpu").unwrap();
        let mut l = Loader::new(&o).unwrap();
        l.set_epoch(epoch).unwrap();
        let mut out = Vec::new();
        while let Some(b) = l.next().unwrap() {
            out.push(b.field(1).unwrap().data.unwrap().to_vec());
        }
        out
    };
    let mut l = device_loader(&fake, &options(counting_source(40), &kv));
    let held = l.next().unwrap().unwrap();
    eventually("the prefetcher ran ahead", || {
        fake.counters().copies_done >= 8
    });
    l.set_epoch(2).unwrap();
    assert_eq!((l.epoch(), l.position()), (2, 0));
    let mut got = Vec::new();
    while let Some(b) = l.next().unwrap() {
        got.push(contents(&fake, &b)[1].clone());
    }
    assert_eq!(
        got,
        host_epoch(2),
        "exactly epoch 2, nothing copied before set_epoch"
    );
    assert_eq!(l.stats().batches, 11);
    // The end of epoch 2 was reached: set_epoch(3) keeps the work already ahead.
    l.set_epoch(3).unwrap();
    let first = l.next().unwrap().unwrap();
    assert_eq!(contents(&fake, &first)[1], host_epoch(3)[0]);
    assert_eq!(
        contents(&fake, &held)[1].len(),
        4,
        "a held batch stays valid"
    );
    drop((first, held, l));
    let c = fake.counters();
    assert_eq!(
        (c.live_buffers, c.live_events, c.live_streams),
        (0, 0, 0),
        "{c:?}"
    );
    assert!(fake.violations().is_empty(), "{:?}", fake.violations());
}
