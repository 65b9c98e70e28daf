//! `stoker_loader`: create, iterate, inspect, save, free.

use std::ffi::c_char;
use std::sync::Arc;

use stoker_core::Loader;

use crate::error::fail;
use crate::ffi::{free_raw, into_raw, invalid_argument};
use crate::types::SharedBatch;
use crate::types::{stoker_batch, stoker_loader, stoker_options, stoker_stats, stoker_status};

/// The `Loader` for the rest of this call, or an `INVALID_ARGUMENT` return (0 where a value is
/// returned) when another call holds it: a loader is driven by one call at a time.
macro_rules! drive {
    ($l:expr) => {
        match $l.drive() {
            Some(driven) => driven,
            None => {
                return invalid_argument(
                    FFI_FN,
                    "the loader is in use by another call (on another thread, or a source \
                     callback calling into its own loader); a loader is driven by one call \
                     at a time",
                )
            }
        }
    };
}

/// Starts a loader (and its worker threads) from options; the options may be freed afterwards.
/// On failure `*out` is NULL. With `device=cuda[:N]` this loads the CUDA driver and fails with
/// `STOKER_ERR_UNSUPPORTED`, saying why, when there is no driver or no such device.
///
/// The loader's threads do not survive `fork()`: in a child process forked after this call,
/// `stoker_loader_next`, `stoker_loader_set_epoch`, `stoker_loader_stats` and
/// `stoker_loader_worker_busy_ns` on this loader fail with `STOKER_ERR_UNSUPPORTED`,
/// `stoker_loader_free` frees nothing (the loader is leaked rather than joining threads that do
/// not exist there), and a batch released there gives its memory straight back to the system.
/// Make a new loader in the child; the parent's loader goes on unaffected.
#[no_mangle]
pub extern "C" fn stoker_loader_new(
    o: *const stoker_options,
    out: *mut *mut stoker_loader,
) -> stoker_status {
    ffi_boundary!(stoker_loader_new => {
        clear_out!(out);
        let o = try_ref!(o);
        match Loader::new(&o.inner) {
            Ok(loader) => {
                let handle = stoker_loader::from_loader(loader);
                // SAFETY: `out` was checked non-NULL and writable by `clear_out!`.
                unsafe { out.write(into_raw(handle)) };
                stoker_status::STOKER_OK
            }
            Err(e) => fail(&e),
        }
    })
}

/// The next batch: `STOKER_OK` and `*out` set, or `STOKER_END_OF_EPOCH` and `*out` NULL (the
/// call after that starts the next epoch). On an error `*out` is NULL and the failed batch is
/// consumed: the next call moves past it.
///
/// With `device=cuda[:N]` the batch's fields are in device memory (`device_type` 2) and its copy
/// may still be running: call `stoker_batch_wait` with every stream that reads it (or
/// `stoker_batch_synchronize`) before using it, and before releasing it. When the caller holds
/// every device buffer of the ring (`prefetch_factor + 1`) this fails with
/// `STOKER_ERR_INVALID_ARGUMENT` instead of waiting forever: release a batch first.
#[no_mangle]
pub extern "C" fn stoker_loader_next(
    l: *mut stoker_loader,
    out: *mut *mut stoker_batch,
) -> stoker_status {
    ffi_boundary!(stoker_loader_next => {
        clear_out!(out);
        let l = try_ref!(l);
        match drive!(l).loader().next() {
            Ok(Some(batch)) => {
                let handle = stoker_batch {
                    shared: Arc::new(SharedBatch::new(batch)),
                };
                // SAFETY: `out` was checked non-NULL and writable by `clear_out!`.
                unsafe { out.write(into_raw(handle)) };
                stoker_status::STOKER_OK
            }
            Ok(None) => stoker_status::STOKER_END_OF_EPOCH,
            Err(e) => fail(&e),
        }
    })
}

/// Batches per epoch, or -1 when unknown (a streaming source) or `l` is NULL.
#[no_mangle]
pub extern "C" fn stoker_loader_batches_per_epoch(l: *const stoker_loader) -> i64 {
    ffi_boundary!(stoker_loader_batches_per_epoch => {
        try_ref!(l).batches_per_epoch
    })
}

/// The epoch the next batch belongs to (0 for NULL, or while another call drives the loader).
#[no_mangle]
pub extern "C" fn stoker_loader_epoch(l: *const stoker_loader) -> u64 {
    ffi_boundary!(stoker_loader_epoch => {
        let l = try_ref!(l);
        drive!(l).loader().epoch()
    })
}

/// Makes the next batch the first of `epoch` (the `DistributedSampler.set_epoch` habit): batches
/// being built or copied ahead are discarded, never delivered; batches the caller holds stay
/// valid. Nothing changes when the loader already stands at the start of `epoch`, or was just
/// resumed (`resume_state`) into `epoch` and has delivered nothing since, so a `set_epoch(e)`
/// before each epoch continues a resumed epoch instead of restarting it.
#[no_mangle]
pub extern "C" fn stoker_loader_set_epoch(l: *mut stoker_loader, epoch: u64) -> stoker_status {
    ffi_boundary!(stoker_loader_set_epoch => {
        let l = try_ref!(l);
        match drive!(l).loader().set_epoch(epoch) {
            Ok(()) => stoker_status::STOKER_OK,
            Err(e) => fail(&e),
        }
    })
}

/// Closes the loader from any thread: a `stoker_loader_next` waiting for a batch in another
/// thread returns `STOKER_ERR_CLOSED` at once, and so does every later call on the loader
/// except those that read it (`stoker_loader_stats`, `stoker_loader_worker_busy_ns`,
/// `stoker_loader_save_state`: a watchdog that closes a stalled loader can still checkpoint
/// where it stood) and `stoker_loader_free`. Closing twice is closing once.
/// Freeing stays with the thread that drives the loader, after its `next` has returned: call
/// `stoker_loader_free` as usual (it joins the worker threads; one stuck in a stalled read is
/// joined once that read returns). With `num_workers=0` the batch is built by the calling thread
/// itself, so a close takes effect when that build returns.
#[no_mangle]
pub extern "C" fn stoker_loader_close(l: *const stoker_loader) -> stoker_status {
    ffi_boundary!(stoker_loader_close => {
        try_ref!(l).closer.close();
        stoker_status::STOKER_OK
    })
}

/// The loader's counters, safe to call from any thread. The caller sets `out->size` to
/// `sizeof(stoker_stats)`; only the fields that fit in `size` bytes are written.
#[no_mangle]
pub extern "C" fn stoker_loader_stats(
    l: *const stoker_loader,
    out: *mut stoker_stats,
) -> stoker_status {
    ffi_boundary!(stoker_loader_stats => {
        non_null!(out);
        // SAFETY: `out` is non-NULL; by the size protocol it is valid for at least its first
        // field, `size`, which the caller set. An unaligned pointer is tolerated.
        let size = unsafe { out.cast::<u64>().read_unaligned() };
        if size < std::mem::size_of::<u64>() as u64 {
            return invalid_argument(
                FFI_FN,
                format_args!("out->size is {size}; set it to sizeof(stoker_stats)"),
            );
        }
        let l = try_ref!(l);
        let s = match l.stats.try_snapshot() {
            Ok(s) => s,
            Err(e) => return fail(&e),
        };
        let full = stoker_stats {
            size,
            batches: s.batches,
            samples: s.samples,
            samples_skipped: s.samples_skipped,
            wait_ns_total: s.wait_ns_total,
            wait_ns_p50: s.wait_ns_p50,
            wait_ns_p95: s.wait_ns_p95,
            wait_ns_max: s.wait_ns_max,
            elapsed_ns: s.elapsed_ns,
            readiness: s.readiness,
            worker_busy: s.worker_busy,
            slabs_pinned: s.slabs_pinned,
            pin_failures: s.pin_failures,
            rank: s.rank,
            world_size: s.world_size,
            local_rank: s.local_rank,
            local_world_size: s.local_world_size,
            launcher: s.launcher,
            read_ns: s.read_ns,
            decode_ns: s.decode_ns,
            transform_ns: s.transform_ns,
            collate_ns: s.collate_ns,
            h2d_ns: s.h2d_ns,
            num_workers: s.num_workers,
            read_ns_p50: s.read_ns_p50,
            read_ns_p95: s.read_ns_p95,
            decode_ns_p50: s.decode_ns_p50,
            decode_ns_p95: s.decode_ns_p95,
            transform_ns_p50: s.transform_ns_p50,
            transform_ns_p95: s.transform_ns_p95,
            collate_ns_p50: s.collate_ns_p50,
            collate_ns_p95: s.collate_ns_p95,
            h2d_ns_p50: s.h2d_ns_p50,
            h2d_ns_p95: s.h2d_ns_p95,
            busy_ns: s.busy_ns,
            memory_budget: s.memory_budget,
            batch_bytes: s.batch_bytes,
            in_flight_cap: s.in_flight_cap,
            in_flight_cap_requested: s.in_flight_cap_requested,
            prefetch_factor: s.prefetch_factor,
            autotune_decisions: s.autotune_decisions,
            decoded_zune: s.decoded_zune,
            decoded_turbo: s.decoded_turbo,
            decoded_turbo_region: s.decoded_turbo_region,
            decoded_turbo_scaled: s.decoded_turbo_scaled,
            in_flight_depth: s.in_flight_depth,
            batch_memory_bytes: s.batch_memory_bytes,
            batch_memory_peak_bytes: s.batch_memory_peak_bytes,
            page_faults: s.page_faults,
            h2d_bytes: s.h2d_bytes,
            device_memory_bytes: s.device_memory_bytes,
            decoded_device: s.decoded_device,
            gpu_decode_share: s.gpu_decode_share,
        };
        // Every field is 8 bytes, so the fields that fit end at `size` rounded down to 8.
        let fit = (size.min(std::mem::size_of::<stoker_stats>() as u64) as usize) & !7;
        let start = std::mem::size_of::<u64>(); // `size` itself is the caller's
        // SAFETY: the caller's struct is valid for `size` bytes and `fit <= size`; `full` is a
        // local `stoker_stats`, at least `fit` bytes long, that cannot overlap it.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (&full as *const stoker_stats).cast::<u8>().add(start),
                out.cast::<u8>().add(start),
                fit - start,
            );
        }
        stoker_status::STOKER_OK
    })
}

/// Time each worker spent building batches, in nanoseconds, by worker number (in the order workers
/// were started; a worker autotune stopped keeps its entry). Writes the first `min(len, count)`
/// values to `out` (which may be NULL when `len` is 0) and sets `*count` to the number of
/// workers. Safe to call from any thread.
#[no_mangle]
pub extern "C" fn stoker_loader_worker_busy_ns(
    l: *const stoker_loader,
    out: *mut u64,
    len: usize,
    count: *mut usize,
) -> stoker_status {
    ffi_boundary!(stoker_loader_worker_busy_ns => {
        non_null!(count);
        let l = try_ref!(l);
        if out.is_null() && len != 0 {
            return invalid_argument(
                FFI_FN,
                format_args!("argument `out` is NULL but `len` is {len}"),
            );
        }
        let busy = match l.stats.try_snapshot() {
            Ok(s) => s.worker_busy_ns,
            Err(e) => return fail(&e),
        };
        // SAFETY: `count` is non-NULL (checked above) and writable by the C contract.
        unsafe { count.write(busy.len()) };
        let n = busy.len().min(len);
        if n > 0 {
            // SAFETY: `out` is non-NULL (n > 0 implies len > 0, checked above) and writable for
            // `len >= n` values by the C contract; `busy` is ours and cannot overlap it.
            unsafe { std::ptr::copy_nonoverlapping(busy.as_ptr(), out, n) };
        }
        stoker_status::STOKER_OK
    })
}

/// Writes the loader's position as a NUL-terminated string for the `resume_state` option and sets
/// `*needed` to its size including the NUL. With `buf == NULL, len == 0` it only sets `*needed`;
/// a non-NULL `buf` shorter than `*needed` gets nothing written and gives
/// `STOKER_ERR_INVALID_ARGUMENT`.
#[no_mangle]
pub extern "C" fn stoker_loader_save_state(
    l: *const stoker_loader,
    buf: *mut c_char,
    len: usize,
    needed: *mut usize,
) -> stoker_status {
    ffi_boundary!(stoker_loader_save_state => {
        non_null!(needed);
        let l = try_ref!(l);
        let state = drive!(l).loader().save_state();
        let size = state.len() + 1;
        // SAFETY: `needed` is non-NULL (checked above) and writable by the C contract.
        unsafe { needed.write(size) };
        if buf.is_null() {
            if len == 0 {
                return stoker_status::STOKER_OK;
            }
            return invalid_argument(
                FFI_FN,
                format_args!("argument `buf` is NULL but `len` is {len}"),
            );
        }
        if len < size {
            return invalid_argument(
                FFI_FN,
                format_args!("buffer of {len} bytes is too short: the state needs {size}"),
            );
        }
        // SAFETY: `buf` is non-NULL and writable for `len >= size` bytes by the C contract; the
        // state is a Rust string that cannot overlap it.
        unsafe {
            std::ptr::copy_nonoverlapping(state.as_ptr(), buf.cast::<u8>(), state.len());
            buf.add(state.len()).write(0);
        }
        stoker_status::STOKER_OK
    })
}

/// Stops the loader: joins every thread it started and frees it. Batches and DLPack exports it
/// delivered stay valid until released. NULL is a no-op. In a child process forked after the
/// loader was made, it joins nothing and leaks the loader (see `stoker_loader_new`).
#[no_mangle]
pub extern "C" fn stoker_loader_free(l: *mut stoker_loader) {
    ffi_boundary!(stoker_loader_free => {
        // SAFETY: by the C contract `l` is NULL or came from `stoker_loader_new`, is freed once,
        // and no other thread uses it now.
        unsafe { free_raw(l) }
    })
}
