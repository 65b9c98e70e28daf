//! Iterable sources: the caller's stream of samples with no length (PyTorch's
//! `IterableDataset`), through callbacks (`stoker_iterable_callbacks`).
//!
//! The loader opens one stream per rank and epoch (`stoker_stream_info`), asks it for samples
//! until it ends, and closes it. `next` gives a sample through the same `stoker_sample_*`
//! functions as a custom source's `read`. Calls on one stream never overlap, but they may come
//! from different threads (the loader's, then its feeder thread's).

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::Arc;

use stoker_core::{IterableSource, SampleStream, SampleWriter, SourceSpec, StreamInfo};

use crate::ffi::invalid_argument;
use crate::source::stoker_sample;
use crate::types::{stoker_options, stoker_status};

/// Which stream to open: this rank's share of one epoch. `worker` is always 0 and `num_workers`
/// 1: the loader reads one stream per rank, in order, so that batches are the same for a seed
/// whatever `num_workers` is (workers decode and collate in parallel).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct stoker_stream_info {
    pub rank: u64,
    pub world_size: u64,
    pub worker: u64,
    pub num_workers: u64,
    pub seed: u64,
    pub epoch: u64,
}

/// The caller's iterable dataset. `open`, `next` are required; the others may be NULL.
///
/// An epoch ends when the rank's stream ends; with the option `num_samples=N` every rank
/// delivers exactly `ceil(N / world_size)` samples (opening its stream again if it ends sooner),
/// so that every rank has the same number of batches. A stream must give the same samples for
/// the same `stoker_stream_info`: a resumed loader replays the epoch from its start unless
/// `save_state` is given and `shuffle_buffer` is 0.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct stoker_iterable_callbacks {
    /// Passed back to every call.
    pub user: *mut c_void,
    /// Opens the stream `info` describes and writes its handle (any pointer) to `*stream`.
    /// `resume_state` is NULL, or a string `save_state` returned: continue after it. 0 = ok;
    /// otherwise the loader fails with STOKER_ERR_CALLBACK (see `stoker_stream_fail`).
    pub open: Option<
        unsafe extern "C" fn(
            user: *mut c_void,
            info: *const stoker_stream_info,
            resume_state: *const c_char,
            stream: *mut *mut c_void,
        ) -> i32,
    >,
    /// Gives the next sample through the `stoker_sample_put_*` functions and returns 0, or
    /// returns 1 (STOKER_END_OF_EPOCH) at the end of the stream. Any other value fails this
    /// sample (its message from `stoker_sample_fail`); the stream is then asked for the next.
    pub next: Option<
        unsafe extern "C" fn(
            user: *mut c_void,
            stream: *mut c_void,
            out: *mut stoker_sample,
        ) -> i32,
    >,
    /// Closes a stream (once, whether it ended or not); may be NULL.
    pub close: Option<unsafe extern "C" fn(user: *mut c_void, stream: *mut c_void)>,
    /// Releases `user` once, when the last loader (or options object) using it is freed; may be
    /// NULL.
    pub drop: Option<unsafe extern "C" fn(user: *mut c_void)>,
    /// The stream's position after the samples given so far, as a NUL-terminated string that
    /// stays valid until the next call on this stream (copied at once); NULL if it cannot say.
    /// May be NULL: then a resumed loader replays the epoch.
    pub save_state:
        Option<unsafe extern "C" fn(user: *mut c_void, stream: *mut c_void) -> *const c_char>,
}

/// The callbacks, owned by every loader made from them; dropping the last runs `drop(user)`.
struct Callbacks(stoker_iterable_callbacks);

// SAFETY: the C contract makes the callbacks callable from any thread (calls on one stream
// never overlap); stoker adds no thread affinity of its own.
unsafe impl Send for Callbacks {}
// SAFETY: as above; different streams' calls may run concurrently only for different loaders,
// which the contract allows.
unsafe impl Sync for Callbacks {}

impl Drop for Callbacks {
    fn drop(&mut self) {
        if let Some(drop_user) = self.0.drop {
            // SAFETY: the caller's function, called once with its own `user`, as documented.
            unsafe { drop_user(self.0.user) };
        }
    }
}

thread_local! {
    /// The message a callback gave `stoker_stream_fail` on this thread.
    static STREAM_FAILURE: RefCell<Option<String>> = const { RefCell::new(None) };
    /// Whether an `open` or `next` callback is running on this thread.
    static IN_CALLBACK: RefCell<bool> = const { RefCell::new(false) };
}

/// Runs `call` as a callback: `stoker_stream_fail` may be used during it; returns its result and
/// the message given.
fn as_callback<R>(call: impl FnOnce() -> R) -> (R, Option<String>) {
    STREAM_FAILURE.with(|f| f.borrow_mut().take());
    IN_CALLBACK.with(|c| *c.borrow_mut() = true);
    let result = call();
    IN_CALLBACK.with(|c| *c.borrow_mut() = false);
    (result, STREAM_FAILURE.with(|f| f.borrow_mut().take()))
}

/// Inside an iterable source's `open` or `next` callback, before it returns failure: the
/// message the loader reports (for `next`, the same as `stoker_sample_fail`). Outside a
/// callback it fails with STOKER_ERR_INVALID_ARGUMENT.
#[no_mangle]
pub extern "C" fn stoker_stream_fail(message: *const c_char) -> stoker_status {
    ffi_boundary!(stoker_stream_fail => {
        let message = try_str!(message);
        if !IN_CALLBACK.with(|c| *c.borrow()) {
            return invalid_argument(FFI_FN, "called outside an iterable source's open or next callback");
        }
        STREAM_FAILURE.with(|f| *f.borrow_mut() = Some(message.to_owned()));
        stoker_status::STOKER_OK
    })
}

struct CIterable(Arc<Callbacks>);

impl IterableSource for CIterable {
    fn open(
        &self,
        info: &StreamInfo,
        resume: Option<&str>,
    ) -> Result<Box<dyn SampleStream>, String> {
        let cb = &self.0 .0;
        let Some(open) = cb.open else {
            return Err("open callback is NULL".into());
        };
        let c_info = stoker_stream_info {
            rank: info.rank as u64,
            world_size: info.world_size as u64,
            worker: info.worker as u64,
            num_workers: info.num_workers as u64,
            seed: info.seed,
            epoch: info.epoch,
        };
        let resume = resume
            .map(CString::new)
            .transpose()
            .map_err(|_| "the resume state holds a NUL byte".to_string())?;
        let mut stream: *mut c_void = std::ptr::null_mut();
        let (rc, failure) = as_callback(|| {
            // SAFETY: the caller's function with its own `user`; `info` and `resume` live for
            // the call and `stream` is a valid out-pointer.
            unsafe {
                open(
                    cb.user,
                    &c_info,
                    resume.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
                    &mut stream,
                )
            }
        });
        if rc != 0 {
            return Err(failure.unwrap_or_else(|| format!("open() returned {rc}")));
        }
        Ok(Box::new(CStream {
            callbacks: Arc::clone(&self.0),
            stream,
        }))
    }

    fn saves_state(&self) -> bool {
        self.0 .0.save_state.is_some()
    }
}

/// One open stream; dropping it calls `close`.
struct CStream {
    callbacks: Arc<Callbacks>,
    stream: *mut c_void,
}

// SAFETY: the stream handle is only passed back to the caller's callbacks, which the contract
// allows from any thread as long as calls on one stream do not overlap; `&mut self` on every
// call guarantees that.
unsafe impl Send for CStream {}

impl SampleStream for CStream {
    fn next(&mut self, out: &mut SampleWriter<'_>) -> Result<bool, String> {
        let cb = &self.callbacks.0;
        let Some(next) = cb.next else {
            return Err("next callback is NULL".into());
        };
        let ((rc, sample_failure), stream_failure) = as_callback(|| {
            stoker_sample::with_live(out, |sample| {
                // SAFETY: the caller's function with its own `user` and stream, and a sample
                // handle live for the duration of the call.
                unsafe { next(cb.user, self.stream, sample) }
            })
        });
        let failure = sample_failure.or(stream_failure);
        match (rc, failure) {
            (0, None) => Ok(true),
            (1, _) => Ok(false),
            (0, Some(m)) => Err(format!("next() returned 0 after a failure was given: {m}")),
            (_, Some(m)) => Err(m),
            (rc, None) => Err(format!("next() returned {rc}")),
        }
    }

    fn save_state(&mut self) -> Result<Option<String>, String> {
        let cb = &self.callbacks.0;
        let Some(save) = cb.save_state else {
            return Ok(None);
        };
        // SAFETY: the caller's function with its own `user` and stream.
        let state = unsafe { save(cb.user, self.stream) };
        if state.is_null() {
            return Ok(None);
        }
        // SAFETY: non-NULL; by the contract a NUL-terminated string valid until the next call on
        // this stream, copied here before any other.
        let state = unsafe { CStr::from_ptr(state) };
        state
            .to_str()
            .map(|s| Some(s.to_owned()))
            .map_err(|_| "save_state() returned a string that is not UTF-8".to_string())
    }
}

impl Drop for CStream {
    fn drop(&mut self) {
        if let Some(close) = self.callbacks.0.close {
            // SAFETY: the caller's function, once per stream, with its own `user` and stream.
            unsafe { close(self.callbacks.0.user, self.stream) };
        }
    }
}

/// Makes the options' source the caller's iterable callbacks (`open` and `next` required). The
/// structure is copied. The fields of every sample are learnt from the first sample of rank
/// `rank`'s stream of the first epoch, when a loader is made (that stream is then read on).
/// `stoker_loader_batches_per_epoch` is -1 unless `num_samples` is set.
#[no_mangle]
pub extern "C" fn stoker_options_set_iterable_callbacks(
    o: *mut stoker_options,
    cb: *const stoker_iterable_callbacks,
) -> stoker_status {
    ffi_boundary!(stoker_options_set_iterable_callbacks => {
        let o = try_mut!(o);
        let cb = *try_ref!(cb);
        let callbacks = Arc::new(Callbacks(cb));
        if cb.open.is_none() || cb.next.is_none() {
            // `callbacks` drops here and releases `user`, as on every other path.
            return invalid_argument(FFI_FN, "callbacks `open` and `next` are required");
        }
        o.inner.set_source(SourceSpec::Iterable(Arc::new(CIterable(callbacks))));
        stoker_status::STOKER_OK
    })
}
