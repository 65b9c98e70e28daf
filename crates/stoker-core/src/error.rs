//! The one error type of the engine. Every variant carries what a user needs to act: the option
//! key, the file, the sample index. The C ABI maps [`ErrorKind`] to `stoker_status` in one place.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, as data: each kind is something a caller can react to differently.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    InvalidArgument,
    Io,
    Decode,
    Unsupported,
    Timeout,
    Callback,
    Closed,
    Internal,
    OutOfMemory,
    Cuda,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An option key that does not exist, or a value that does not parse or is out of range.
    #[error("option `{key}`: {reason}")]
    InvalidOption { key: String, reason: String },

    /// A bad argument that is not an option (a field name, an index, a resume state).
    #[error("{0}")]
    InvalidArgument(String),

    /// A file or directory that is missing, unreadable or too short.
    #[error("{}: {reason}", path.display())]
    Io { path: PathBuf, reason: String },

    /// A sample that cannot be turned into its slot of the batch: corrupt, truncated, wrong shape.
    #[error("sample {index} ({what}): {reason}")]
    Sample {
        index: u64,
        what: String,
        reason: String,
    },

    /// A malformed file detected before any sample is read (an npy header, say).
    #[error("{}: {reason}", path.display())]
    Format { path: PathBuf, reason: String },

    #[error("{0}")]
    Unsupported(String),

    #[error("no batch arrived within timeout_ms={0}")]
    Timeout(u64),

    /// A user callback reported failure.
    #[error("sample {index}: source callback failed: {message}")]
    Callback { index: u64, message: String },

    #[error("{0}")]
    Closed(String),

    /// A bug: a caught panic, a broken invariant.
    #[error("internal error: {0}")]
    Internal(String),

    #[error("out of memory: {0}")]
    OutOfMemory(String),

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

impl Error {
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
