//! Custom sources: the caller's own dataset through callbacks (`stoker_source_callbacks`), and
//! the `stoker_sample_*` functions a `read` callback uses to give a sample's fields.
//!
//! A `read` receives a `stoker_sample*` that is live only during that call. Sample handles come
//! from a process-wide pool and are never freed, so a pointer kept past its call still points to
//! a valid object: using it then finds the handle inactive (`STOKER_ERR_INVALID_ARGUMENT`), never
//! freed memory.

use std::cell::Cell;
use std::ffi::{c_char, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use stoker_core::source::{ReadFn, SampleWriter};
use stoker_core::{DType, SourceSpec};

use crate::error::set_message;
use crate::ffi::invalid_argument;
use crate::types::{stoker_options, stoker_status, STOKER_MAX_DIMS};

/// The caller's dataset (PyTorch's map-style `Dataset`). `read` is called concurrently from
/// worker threads and must be thread-safe; `drop` (may be NULL) runs once, when the last loader
/// (or options object) using the callbacks is freed.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct stoker_source_callbacks {
    /// Passed back to every call.
    pub user: *mut c_void,
    /// Number of samples.
    pub len: Option<unsafe extern "C" fn(user: *mut c_void) -> u64>,
    /// Gives sample `index` through the `stoker_sample_put_*` functions; 0 = ok.
    pub read:
        Option<unsafe extern "C" fn(user: *mut c_void, index: u64, out: *mut stoker_sample) -> i32>,
    /// Releases `user`; may be NULL.
    pub drop: Option<unsafe extern "C" fn(user: *mut c_void)>,
}

/// One sample being given by a `read` callback (opaque); valid only during that call.
pub struct stoker_sample {
    state: Mutex<SampleState>,
}

struct SampleState {
    /// The writer of the `read` call in progress; NULL when no call is.
    writer: *mut SampleWriter<'static>,
    /// The message given to `stoker_sample_fail`.
    failure: Option<String>,
}

// SAFETY: `writer` is only dereferenced under the mutex while the `read` call that set it is in
// progress (it points into that call's stack frame on the calling thread, which is blocked in the
// callback), so moving or sharing the handle across threads cannot reach a dead writer.
unsafe impl Send for SampleState {}

/// Sample handles are allocated once and live until the process ends, so a handle a callback
/// kept past its call finds no writer instead of freed memory. Each thread keeps the handle it
/// last used (no lock on the path of a sample); a thread that ends gives it to `IDLE_SAMPLES`,
/// where a new thread takes one. Those two moments only *try* the lock: a process forked while
/// another thread held it must not block on it forever, so a handle that finds the lock taken
/// is not reused (one per such thread start or end) and the caller allocates a new one.
static IDLE_SAMPLES: Mutex<Vec<&'static stoker_sample>> = Mutex::new(Vec::new());

/// Every handle ever allocated, linked through `next`: none is freed, and this keeps each one
/// reachable whoever holds it (a thread, `IDLE_SAMPLES`, or nobody after a lock found taken), so
/// a leak checker reports none. Handles are only ever pushed, so a compare-and-swap loop is the
/// whole algorithm (with no pop there is no ABA).
static ALL_SAMPLES: AtomicPtr<Allocated> = AtomicPtr::new(std::ptr::null_mut());

struct Allocated {
    sample: stoker_sample,
    next: *mut Allocated,
}

/// A new handle, linked into `ALL_SAMPLES`.
fn new_sample() -> &'static stoker_sample {
    let node: &'static mut Allocated = Box::leak(Box::new(Allocated {
        sample: stoker_sample {
            state: Mutex::new(SampleState {
                writer: std::ptr::null_mut(),
                failure: None,
            }),
        },
        next: std::ptr::null_mut(),
    }));
    let mut head = ALL_SAMPLES.load(Ordering::Relaxed);
    loop {
        node.next = head;
        // Release: a thread that reads the list sees the node's fields written.
        match ALL_SAMPLES.compare_exchange_weak(
            head,
            &mut *node,
            Ordering::Release,
            Ordering::Relaxed,
        ) {
            Ok(_) => break,
            Err(now) => head = now,
        }
    }
    let node: &'static Allocated = node;
    &node.sample
}

/// This thread's idle handle; returned to `IDLE_SAMPLES` when the thread ends.
struct ThreadSample(Cell<Option<&'static stoker_sample>>);

impl Drop for ThreadSample {
    fn drop(&mut self) {
        if let (Some(sample), Ok(mut idle)) = (self.0.take(), IDLE_SAMPLES.try_lock()) {
            idle.push(sample);
        }
    }
}

thread_local! {
    static THREAD_SAMPLE: ThreadSample = const { ThreadSample(Cell::new(None)) };
}

/// An idle handle: this thread's, one another thread left, or a new one.
fn take_sample() -> &'static stoker_sample {
    THREAD_SAMPLE
        .with(|mine| mine.0.take())
        .or_else(|| IDLE_SAMPLES.try_lock().ok()?.pop())
        .unwrap_or_else(new_sample)
}

/// Keeps `sample` as this thread's idle handle (a re-entrant call's second handle goes to
/// `IDLE_SAMPLES`, or is not reused if the lock is taken).
fn give_back(sample: &'static stoker_sample) {
    let spare = THREAD_SAMPLE
        .try_with(|mine| mine.0.replace(Some(sample)))
        .unwrap_or(Some(sample));
    if let (Some(spare), Ok(mut idle)) = (spare, IDLE_SAMPLES.try_lock()) {
        idle.push(spare);
    }
}

impl stoker_sample {
    fn lock(&self) -> MutexGuard<'_, SampleState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `read` with a live sample handle attached to `writer`; returns the callback's result
    /// and the message it gave to `stoker_sample_fail`.
    pub(crate) fn with_live<R>(
        writer: &mut SampleWriter<'_>,
        read: impl FnOnce(*mut stoker_sample) -> R,
    ) -> (R, Option<String>) {
        let sample = take_sample();
        // Erasing the writer's lifetime is sound because the pointer is cleared below, before
        // `writer`'s borrow ends, and only dereferenced in between (see `SampleState`).
        sample.lock().writer = (writer as *mut SampleWriter<'_>).cast();
        let result = read(sample as *const stoker_sample as *mut stoker_sample);
        let failure = {
            let mut state = sample.lock();
            state.writer = std::ptr::null_mut();
            state.failure.take()
        };
        give_back(sample);
        (result, failure)
    }
}

/// The callbacks, owned by every loader made from them; dropping the last runs `drop(user)`.
struct Callbacks(stoker_source_callbacks);

// SAFETY: the C contract makes `read` (and `len`, `drop`) callable from any thread with the same
// `user`; stoker adds no thread affinity of its own.
unsafe impl Send for Callbacks {}
// SAFETY: as above; concurrent `read` calls are part of the contract.
unsafe impl Sync for Callbacks {}

impl Drop for Callbacks {
    fn drop(&mut self) {
        if let Some(drop_user) = self.0.drop {
            // SAFETY: the caller's function, called once with its own `user`, as documented.
            unsafe { drop_user(self.0.user) };
        }
    }
}

/// Makes the options' source the caller's callbacks (`len` and `read` required). The structure is
/// copied; `len` is called now. The fields of every sample are learnt from sample 0 when a loader
/// is made.
#[no_mangle]
pub extern "C" fn stoker_options_set_source_callbacks(
    o: *mut stoker_options,
    cb: *const stoker_source_callbacks,
) -> stoker_status {
    ffi_boundary!(stoker_options_set_source_callbacks => {
        let o = try_mut!(o);
        let cb = *try_ref!(cb);
        let (Some(len_fn), Some(read_fn)) = (cb.len, cb.read) else {
            return invalid_argument(FFI_FN, "callbacks `len` and `read` are required");
        };
        let callbacks = Arc::new(Callbacks(cb));
        // SAFETY: the caller's function with its own `user`, per the contract above.
        let len = unsafe { len_fn(cb.user) };
        let Ok(len) = usize::try_from(len) else {
            return invalid_argument(FFI_FN, format_args!("len() returned {len}, too large"));
        };
        let read: Arc<ReadFn> = Arc::new(move |index, writer| {
            let user = callbacks.0.user;
            let (rc, failure) = stoker_sample::with_live(writer, |sample| {
                // SAFETY: the caller's function with its own `user` and a sample handle that is
                // live for the duration of the call.
                unsafe { read_fn(user, index as u64, sample) }
            });
            match (rc, failure) {
                (0, None) => Ok(()),
                (0, Some(message)) => Err(format!("read() returned 0 after stoker_sample_fail: {message}")),
                (_, Some(message)) => Err(message),
                (rc, None) => Err(format!("read() returned {rc}")),
            }
        });
        o.inner.set_source(SourceSpec::Callback { len, read });
        stoker_status::STOKER_OK
    })
}

/// Runs `put` on the live writer of `s`, or fails with INVALID_ARGUMENT if `s` is not inside its
/// `read` call.
fn put(
    function: &str,
    s: &stoker_sample,
    put: impl FnOnce(&mut SampleWriter<'_>) -> Result<(), String>,
) -> stoker_status {
    let state = s.lock();
    let writer_ptr = state.writer;
    if writer_ptr.is_null() {
        return invalid_argument(
            function,
            "the sample is not live: use it only inside its read() call",
        );
    }
    // SAFETY: non-NULL only while the `read` call that attached it runs, and the mutex makes this
    // the only reference (see `SampleState`).
    let writer = unsafe { &mut *writer_ptr };
    match put(writer) {
        Ok(()) => stoker_status::STOKER_OK,
        Err(message) => {
            set_message(format!("{function}: {message}"));
            stoker_status::STOKER_ERR_INVALID_ARGUMENT
        }
    }
}

/// Gives encoded JPEG or PNG bytes, decoded and transformed into field `image` like an
/// `image_folder` file. The bytes are copied before the call returns.
#[no_mangle]
pub extern "C" fn stoker_sample_put_encoded(
    s: *mut stoker_sample,
    bytes: *const c_void,
    len: usize,
) -> stoker_status {
    ffi_boundary!(stoker_sample_put_encoded => {
        let s = try_ref!(s);
        non_null!(bytes);
        // SAFETY: non-NULL; by the C contract `bytes` is readable for `len` bytes during the call.
        let bytes = unsafe { std::slice::from_raw_parts(bytes.cast::<u8>(), len) };
        put(FFI_FN, s, |w| w.put_encoded(bytes))
    })
}

/// Gives a C-contiguous tensor for `field`: `ndim` (0 to STOKER_MAX_DIMS) dimensions of `shape`,
/// elements of `dtype` (a `stoker_dtype` value) at `data`, copied before the call returns. The
/// dtype is taken as an integer so that an out-of-range value is an error, not undefined
/// behaviour. Every sample's tensor must have the first sample's shape, except in the leading
/// dimension under option `pad`, and for a uint8 image (`[H, W, 3]` or `[3, H, W]`, see option
/// `input_layout`) when the loader's transform fixes the output size: its size may vary.
#[no_mangle]
pub extern "C" fn stoker_sample_put_tensor(
    s: *mut stoker_sample,
    field: *const c_char,
    dtype: i32,
    ndim: i32,
    shape: *const i64,
    data: *const c_void,
) -> stoker_status {
    ffi_boundary!(stoker_sample_put_tensor => {
        let s = try_ref!(s);
        let field = try_str!(field);
        let Some(dtype) = dtype_of(dtype) else {
            return invalid_argument(FFI_FN, format_args!("dtype {dtype} is not a stoker_dtype"));
        };
        let Ok(ndim) = usize::try_from(ndim).map_err(|_| ()).and_then(|n| if n <= STOKER_MAX_DIMS { Ok(n) } else { Err(()) }) else {
            return invalid_argument(FFI_FN, format_args!("ndim {ndim} is not in [0, {STOKER_MAX_DIMS}]"));
        };
        let dims: &[i64] = if ndim == 0 {
            &[]
        } else {
            non_null!(shape);
            // SAFETY: non-NULL; by the C contract `shape` holds `ndim` values.
            unsafe { std::slice::from_raw_parts(shape, ndim) }
        };
        let mut shape_usize = [0usize; STOKER_MAX_DIMS];
        for (d, &v) in shape_usize.iter_mut().zip(dims) {
            let Ok(v) = usize::try_from(v) else {
                return invalid_argument(FFI_FN, format_args!("field `{field}`: negative dimension {v}"));
            };
            *d = v;
        }
        let shape = &shape_usize[..ndim];
        let Some(bytes) = shape.iter().try_fold(dtype.size(), |acc, &d| acc.checked_mul(d)) else {
            return invalid_argument(FFI_FN, format_args!("field `{field}`: shape {shape:?} overflows"));
        };
        let data: &[u8] = if bytes == 0 {
            &[]
        } else {
            non_null!(data);
            // SAFETY: non-NULL; by the C contract `data` holds the tensor's `bytes` bytes.
            unsafe { std::slice::from_raw_parts(data.cast::<u8>(), bytes) }
        };
        put(FFI_FN, s, |w| w.put_tensor(field, dtype, shape, data))
    })
}

/// Gives the sample's label: field `label`, int64.
#[no_mangle]
pub extern "C" fn stoker_sample_put_label(s: *mut stoker_sample, label: i64) -> stoker_status {
    ffi_boundary!(stoker_sample_put_label => {
        let s = try_ref!(s);
        put(FFI_FN, s, |w| w.put_label(label))
    })
}

/// Records why this sample failed; then return non-zero from `read`. The loader reports
/// STOKER_ERR_CALLBACK with this message (or, under on_error=skip, replaces the sample).
#[no_mangle]
pub extern "C" fn stoker_sample_fail(
    s: *mut stoker_sample,
    message: *const c_char,
) -> stoker_status {
    ffi_boundary!(stoker_sample_fail => {
        let s = try_ref!(s);
        let message = try_str!(message);
        let mut state = s.lock();
        if state.writer.is_null() {
            return invalid_argument(FFI_FN, "the sample is not live: use it only inside its read() call");
        }
        state.failure = Some(message.to_owned());
        stoker_status::STOKER_OK
    })
}

fn dtype_of(code: i32) -> Option<DType> {
    Some(match code {
        0 => DType::U8,
        1 => DType::I32,
        2 => DType::I64,
        3 => DType::F16,
        4 => DType::BF16,
        5 => DType::F32,
        6 => DType::U16,
        _ => return None,
    })
}
