//! The error type of the C API and the guard every exported function runs its body in: a
//! status code out, never a panic across the FFI boundary, and the reason kept for
//! `cudnnGetLastErrorString`.

use crate::types::*;
use std::cell::RefCell;

/// A failed call: the status code cuDNN would return and a message that says why.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: Status,
    pub msg: String,
}

pub type R<T> = Result<T, ApiError>;

impl ApiError {
    pub fn new(status: Status, msg: impl Into<String>) -> ApiError {
        ApiError { status, msg: msg.into() }
    }
}

/// CUDNN_STATUS_BAD_PARAM with a message.
pub fn bad(msg: impl Into<String>) -> ApiError {
    ApiError::new(CUDNN_STATUS_BAD_PARAM, msg)
}

/// CUDNN_STATUS_NOT_SUPPORTED with a message.
pub fn unsupported(msg: impl Into<String>) -> ApiError {
    ApiError::new(CUDNN_STATUS_NOT_SUPPORTED, msg)
}

/// A ferrodnn error as the status cuDNN gives the same failure.
impl From<ferrodnn::Error> for ApiError {
    fn from(e: ferrodnn::Error) -> ApiError {
        let status = match &e {
            ferrodnn::Error::InvalidGraph(_) | ferrodnn::Error::InvalidArgument(_) => CUDNN_STATUS_BAD_PARAM,
            ferrodnn::Error::NotSupported(_) => CUDNN_STATUS_NOT_SUPPORTED,
            ferrodnn::Error::Device(_) => CUDNN_STATUS_EXECUTION_FAILED,
            ferrodnn::Error::Serialization(_) => CUDNN_STATUS_INTERNAL_ERROR,
        };
        ApiError::new(status, e.to_string())
    }
}

/// Checks a pointer argument is not null.
pub fn non_null<T>(p: *const T, name: &str) -> R<()> {
    if p.is_null() {
        return Err(ApiError::new(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, format!("`{name}` is a null pointer")));
    }
    Ok(())
}

/// Writes `v` through an out-pointer argument after checking it is not null.
///
/// # Safety
/// `p` must be null or valid for a write of a `T` (the C caller's contract).
pub unsafe fn write_out<T>(p: *mut T, name: &str, v: T) -> R<()> {
    non_null(p, name)?;
    // SAFETY: not null (checked); the caller promises it points at a writable T.
    unsafe { p.write_unaligned(v) };
    Ok(())
}

/// Reads `n` C ints from an array argument after checking it is not null and `n` is sane.
///
/// # Safety
/// `p` must be null or valid for reads of `n` ints (the C caller's contract).
pub unsafe fn read_ints(p: *const i32, n: i32, name: &str) -> R<Vec<i64>> {
    non_null(p, name)?;
    if !(0..=64).contains(&n) {
        return Err(bad(format!("`{name}`: array length {n} is out of range")));
    }
    // SAFETY: not null (checked), and the caller promises `n` readable ints.
    Ok((0..n as usize).map(|i| unsafe { p.add(i).read_unaligned() } as i64).collect())
}

/// Reads a host scalar (alpha, beta, a value) of the data type's scaling type: `double` for
/// double data, `float` otherwise, as cuDNN defines them.
///
/// # Safety
/// `p` must be null or point at a readable `float` (or `double` when `double` is set).
pub unsafe fn read_scalar(p: *const std::ffi::c_void, double: bool, name: &str) -> R<f64> {
    non_null(p, name)?;
    // SAFETY: not null (checked); the caller promises a float (double for double data).
    Ok(unsafe {
        if double {
            (p as *const f64).read_unaligned()
        } else {
            (p as *const f32).read_unaligned() as f64
        }
    })
}

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

/// The calling thread's last error message (empty when none).
pub fn last_error() -> String {
    LAST_ERROR.with(|e| e.borrow().clone())
}

fn set_last_error(msg: String) {
    LAST_ERROR.with(|e| *e.borrow_mut() = msg);
}

/// The logging level: 0 none, 1 each failure, 2 also each call that runs a plan (its graph and
/// the plan's engine and knobs). From `FERRODNN_CUDNN_LOG`, else cuDNN's own
/// `CUDNN_LOGLEVEL_DBG` (0 off, 1 errors, 2 warnings, 3 info: 1 and 2 log failures, 3 every
/// call).
pub fn log_level() -> u8 {
    static LEVEL: std::sync::OnceLock<u8> = std::sync::OnceLock::new();
    *LEVEL.get_or_init(|| match (std::env::var("FERRODNN_CUDNN_LOG"), std::env::var("CUDNN_LOGLEVEL_DBG")) {
        (Ok(v), _) => v.trim().parse::<u8>().unwrap_or(1),
        (_, Ok(v)) => match v.trim().parse::<u8>().unwrap_or(0) {
            0 => 0,
            1 | 2 => 1,
            _ => 2,
        },
        _ => 0,
    })
}

/// Writes a log line where `CUDNN_LOGDEST_DBG` says (`stdout`, `stderr`, or a file appended
/// to; standard error by default).
pub fn log(line: &str) {
    use std::io::Write;
    match std::env::var("CUDNN_LOGDEST_DBG").as_deref() {
        Ok("stdout") => println!("ferrodnn-cudnn: {line}"),
        Ok("stderr") | Err(_) | Ok("") => eprintln!("ferrodnn-cudnn: {line}"),
        Ok(path) => {
            if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
                let _ = writeln!(f, "ferrodnn-cudnn: {line}");
            }
        }
    }
}

/// Runs the body of exported function `name`: its status, or the status of its error (the
/// message kept as the thread's last error, and printed at log level 1 and up), or
/// CUDNN_STATUS_INTERNAL_ERROR when it panicked.
pub fn guard(name: &str, body: impl FnOnce() -> R<()>) -> Status {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(Ok(())) => CUDNN_STATUS_SUCCESS,
        Ok(Err(e)) => {
            let msg = format!("{name}: {} ({})", e.msg, status_name(e.status));
            if log_level() >= 1 {
                log(&msg);
            }
            set_last_error(msg);
            e.status
        }
        Err(panic) => {
            let what = panic.downcast_ref::<String>().cloned().or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default();
            set_last_error(format!("{name}: internal error (a panic: {what}); please report it"));
            CUDNN_STATUS_INTERNAL_ERROR
        }
    }
}
