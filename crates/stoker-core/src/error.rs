//! The one error type of the engine. Every variant carries what a user needs to act: the option
//! key, the file, the sample index. The C ABI maps [`ErrorKind`] to `stoker_status` in one place.

use std::path::PathBuf;

/// The engine's `Result`, with [`Error`] as its default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, as data: each kind is something a caller can react to differently.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// An unknown option key, a malformed or out-of-range value, a bad argument
    /// (`STOKER_ERR_INVALID_ARGUMENT`, -1).
    InvalidArgument,
    /// A file or directory missing, unreadable or too short (`STOKER_ERR_IO`, -2).
    Io,
    /// A corrupt or malformed sample or file (`STOKER_ERR_DECODE`, -3).
    Decode,
    /// Something this build or this data cannot do: no CUDA driver, a gzip shard in indexed
    /// mode (`STOKER_ERR_UNSUPPORTED`, -4).
    Unsupported,
    /// No batch arrived within `timeout_ms` (`STOKER_ERR_TIMEOUT`, -5).
    Timeout,
    /// A user callback reported failure (`STOKER_ERR_CALLBACK`, -6).
    Callback,
    /// The loader was closed, or can no longer deliver (`STOKER_ERR_CLOSED`, -7).
    Closed,
    /// A bug: a caught panic, a broken invariant (`STOKER_ERR_INTERNAL`, -8).
    Internal,
    /// Host or device memory could not be had (`STOKER_ERR_OUT_OF_MEMORY`, -9).
    OutOfMemory,
    /// The CUDA driver reported a failure (`STOKER_ERR_CUDA`, -10).
    Cuda,
}

/// An engine error: its [`kind`](Error::kind) says how to react, its message names the option,
/// file or sample concerned.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An option key that does not exist, or a value that does not parse or is out of range.
    #[error("option `{key}`: {reason}")]
    InvalidOption {
        /// The option key, as given.
        key: String,
        /// What is wrong with the key or its value.
        reason: String,
    },

    /// A bad argument that is not an option (a field name, an index, a resume state).
    #[error("{0}")]
    InvalidArgument(String),

    /// A file or directory that is missing, unreadable or too short.
    #[error("{}: {reason}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error, or what was short.
        reason: String,
    },

    /// A sample that cannot be turned into its slot of the batch: corrupt, truncated, wrong shape.
    #[error("sample {index} ({what}): {reason}")]
    Sample {
        /// The sample's dataset index.
        index: u64,
        /// Where the sample lives (a file, a tar member, an in-memory row), as the source
        /// describes it.
        what: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A malformed file detected before any sample is read (an npy header, say).
    #[error("{}: {reason}", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// What is malformed.
        reason: String,
    },

    /// Something this build or this data cannot do (no CUDA driver, a gzip-compressed shard in
    /// indexed mode, `set_epoch` in the middle of a stream); the message says why.
    #[error("{0}")]
    Unsupported(String),

    /// No batch arrived within `timeout_ms` (the value carried, in milliseconds).
    #[error("no batch arrived within timeout_ms={0}")]
    Timeout(u64),

    /// A user callback reported failure.
    #[error("sample {index}: source callback failed: {message}")]
    Callback {
        /// The dataset index the callback was reading.
        index: u64,
        /// The callback's own message.
        message: String,
    },

    /// The loader was closed ([`Closer`](crate::Closer)), or cannot deliver any more (a failed
    /// `set_epoch`, a batch discarded by `set_epoch`).
    #[error("{0}")]
    Closed(String),

    /// A bug: a caught panic, a broken invariant.
    #[error("internal error: {0}")]
    Internal(String),

    /// Host or device memory refused: a slab `mmap`, a device allocation, an epoch's order
    /// larger than a quarter of physical memory.
    #[error("out of memory: {0}")]
    OutOfMemory(String),

    /// A CUDA driver call failed (other than for lack of memory).
    #[error("CUDA: {0}")]
    Cuda(String),
}

impl ErrorKind {
    /// The status code every face reports for this kind: `stoker_status` in C, `stoker::Status`
    /// in C++, the exception classes of the Python package. Defined here once; the faces map
    /// these numbers, never their own.
    pub const fn code(self) -> i32 {
        match self {
            ErrorKind::InvalidArgument => -1,
            ErrorKind::Io => -2,
            ErrorKind::Decode => -3,
            ErrorKind::Unsupported => -4,
            ErrorKind::Timeout => -5,
            ErrorKind::Callback => -6,
            ErrorKind::Closed => -7,
            ErrorKind::Internal => -8,
            ErrorKind::OutOfMemory => -9,
            ErrorKind::Cuda => -10,
        }
    }

    /// Every kind, in code order.
    pub const ALL: [ErrorKind; 10] = [
        ErrorKind::InvalidArgument,
        ErrorKind::Io,
        ErrorKind::Decode,
        ErrorKind::Unsupported,
        ErrorKind::Timeout,
        ErrorKind::Callback,
        ErrorKind::Closed,
        ErrorKind::Internal,
        ErrorKind::OutOfMemory,
        ErrorKind::Cuda,
    ];
}

/// Status code of a successful call.
pub const STATUS_OK: i32 = 0;
/// Status code of a `next` that found the epoch over (not an error).
pub const STATUS_END_OF_EPOCH: i32 = 1;

/// The message of a caught panic's payload (a `&str` or `String`, as `panic!` makes them).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic payload".to_owned()
    }
}

/// Runs `f`, turning a panic into an [`Error::Internal`] naming its message: the one panic
/// guard of every face's boundary (a panic must never unwind into C or C++).
pub fn catch_panic<T>(f: impl FnOnce() -> T) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|panic| {
        Error::Internal(format!(
            "a bug in stoker, please report it: panic: {}",
            panic_message(&*panic)
        ))
    })
}

/// What an operating-system error says about a path, in words a user acts on ("not found",
/// "permission denied") rather than the C library's ("No such device (os error 19)" is what
/// mapping a directory gives). Kinds without a plainer wording keep the system's message.
pub(crate) fn io_reason(err: &std::io::Error) -> String {
    use std::io::ErrorKind as K;
    match err.kind() {
        K::NotFound => "not found".to_owned(),
        K::PermissionDenied => "permission denied".to_owned(),
        K::IsADirectory => "is a directory, not a file".to_owned(),
        K::NotADirectory => "is not a directory (or a part of the path is a file)".to_owned(),
        _ if err.raw_os_error() == Some(libc::ENODEV) => {
            "is not a regular file and cannot be memory-mapped".to_owned()
        }
        _ => err.to_string(),
    }
}

impl Error {
    /// Which [`ErrorKind`], hence which status code, the faces report for this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidOption { .. } | Error::InvalidArgument(_) => ErrorKind::InvalidArgument,
            Error::Io { .. } => ErrorKind::Io,
            Error::Sample { .. } | Error::Format { .. } => ErrorKind::Decode,
            Error::Unsupported(_) => ErrorKind::Unsupported,
            Error::Timeout(_) => ErrorKind::Timeout,
            Error::Callback { .. } => ErrorKind::Callback,
            Error::Closed(_) => ErrorKind::Closed,
            Error::Internal(_) => ErrorKind::Internal,
            Error::OutOfMemory(_) => ErrorKind::OutOfMemory,
            Error::Cuda(_) => ErrorKind::Cuda,
        }
    }

    /// An invalid value for option `key`.
    pub fn option(key: &str, reason: impl Into<String>) -> Error {
        Error::InvalidOption {
            key: key.to_owned(),
            reason: reason.into(),
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, err: impl std::fmt::Display) -> Error {
        Error::Io {
            path: path.into(),
            reason: err.to_string(),
        }
    }

    /// An operating-system error on `path`, said in words ([`io_reason`]).
    pub(crate) fn os(path: impl Into<PathBuf>, err: std::io::Error) -> Error {
        Error::io(path, io_reason(&err))
    }

    pub(crate) fn format(path: impl Into<PathBuf>, reason: impl Into<String>) -> Error {
        Error::Format {
            path: path.into(),
            reason: reason.into(),
        }
    }

    /// Whether `on_error=skip` may replace the sample that caused this error. Only per-sample
    /// failures qualify; a timeout or a bug must surface.
    pub fn is_sample_error(&self) -> bool {
        matches!(
            self,
            Error::Sample { .. } | Error::Io { .. } | Error::Callback { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The operating system's kinds of path errors become words; others keep its message.
    /// (Permission errors cannot be made in a test that runs as root, so their wording is
    /// checked here rather than through a source.)
    #[test]
    fn io_errors_are_said_in_words() {
        use std::io::{Error as IoError, ErrorKind as K};
        for (err, words) in [
            (IoError::from(K::NotFound), "not found"),
            (IoError::from(K::PermissionDenied), "permission denied"),
            (IoError::from(K::IsADirectory), "is a directory, not a file"),
            (
                IoError::from_raw_os_error(libc::ENODEV),
                "is not a regular file",
            ),
            (IoError::from_raw_os_error(libc::EIO), "Input/output error"),
        ] {
            let reason = io_reason(&err);
            assert!(reason.contains(words), "{err}: {reason}");
        }
        let err = Error::os("/data/x.npy", IoError::from(K::PermissionDenied));
        assert_eq!(err.to_string(), "/data/x.npy: permission denied");
        assert_eq!(err.kind(), ErrorKind::Io);
    }
}
