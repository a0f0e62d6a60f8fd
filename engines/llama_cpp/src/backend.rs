//! The process-wide llama.cpp backend and its log forwarding.
//!
//! llama.cpp has one global log callback, so logs go to the logger of the most recently created
//! instance still alive (in practice a node has one instance per plugin). An instance's logger
//! leaves that list before its destroy returns ([`LogRoute`]): the host frees what the logger
//! points to then, and another instance's threads may still log. The last error line is kept so
//! that a failed model load can say why (llama.cpp only returns NULL), and the sizes llama.cpp
//! reports for the KV caches it allocates are added up for the thread creating a context (it has
//! no call that returns them), so `metrics` reports the cache's real size.

use llama_cpp_2::llama_backend::LlamaBackend;
use llmr_engine_sdk::Logger;
use std::cell::Cell;
use std::ffi::{c_char, c_void, CStr};
use std::sync::{Mutex, OnceLock};

thread_local! {
    /// MiB of KV (and recurrent state) caches llama.cpp reported allocating on this thread.
    static KV_MIB: Cell<f64> = const { Cell::new(0.0) };
}

static BACKEND: OnceLock<LlamaBackend> = OnceLock::new();
/// The live instances' loggers, oldest first, each with its route's number.
static LOGGERS: Mutex<Vec<(u64, Logger)>> = Mutex::new(Vec::new());
static LAST_ERROR: Mutex<String> = Mutex::new(String::new());

pub fn backend() -> &'static LlamaBackend {
    BACKEND.get_or_init(|| {
        let backend = LlamaBackend::init().expect("llama.cpp backend initialises once per process");
        // SAFETY: the callback is a plain function valid for the life of the process.
        unsafe { llama_cpp_sys_2::llama_log_set(Some(forward_log), std::ptr::null_mut()) };
        backend
    })
}

/// An instance's place among the loggers llama.cpp's lines go to: the instance holds it, and
/// dropping it takes the logger out. A line being forwarded holds the list's lock, so once
/// the drop returns no line reaches that logger.
pub struct LogRoute(u64);

/// Sends llama.cpp's lines to `logger` until the route is dropped (or a newer one is added).
pub fn route_logs(logger: Logger) -> LogRoute {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    lock_loggers().push((id, logger));
    LogRoute(id)
}

impl Drop for LogRoute {
    fn drop(&mut self) {
        lock_loggers().retain(|(id, _)| *id != self.0);
    }
}

/// A panic while forwarding a line must not leave the loggers unusable.
fn lock_loggers() -> std::sync::MutexGuard<'static, Vec<(u64, Logger)>> {
    LOGGERS.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Forgets the last error line; call before an operation whose failure should be explained.
pub fn clear_last_error() {
    LAST_ERROR.lock().unwrap().clear();
}

/// The last error line llama.cpp logged since `clear_last_error`.
pub fn last_error() -> String {
    LAST_ERROR.lock().unwrap().clone()
}

/// Bytes of cache llama.cpp reported allocating on this thread since the last call: around a
/// context's creation, its KV cache (both caches of a sliding-window model, added up).
pub fn take_kv_bytes() -> u64 {
    (KV_MIB.with(|m| m.replace(0.0)) * 1024.0 * 1024.0).round() as u64
}

/// The MiB of a cache llama.cpp reports allocating (`llama_kv_cache: size =  96.00 MiB (...`).
fn cache_mib(line: &str) -> Option<f64> {
    let rest = ["llama_kv_cache: size = ", "llama_memory_recurrent: size = "]
        .iter()
        .find_map(|head| line.strip_prefix(head))?;
    rest.split_whitespace().next()?.parse().ok()
}

unsafe extern "C" fn forward_log(level: llama_cpp_sys_2::ggml_log_level, text: *const c_char, _: *mut c_void) {
    if text.is_null() {
        return;
    }
    let text = CStr::from_ptr(text).to_string_lossy();
    let line = text.trim_end();
    if line.is_empty() {
        return;
    }
    if let Some(mib) = cache_mib(line) {
        KV_MIB.with(|m| m.set(m.get() + mib));
    }
    let level = match level {
        llama_cpp_sys_2::GGML_LOG_LEVEL_ERROR => {
            *LAST_ERROR.lock().unwrap() = line.to_string();
            llmr_engine_sdk::abi::LLMR_LOG_ERROR
        }
        // With a unified KV cache llama.cpp compares the whole cache with the training context;
        // the scheduler caps each sequence at its own context, so this one is not a warning.
        llama_cpp_sys_2::GGML_LOG_LEVEL_WARN if line.contains("n_ctx_seq") && line.contains("n_ctx_train") => {
            llmr_engine_sdk::abi::LLMR_LOG_DEBUG
        }
        llama_cpp_sys_2::GGML_LOG_LEVEL_WARN => llmr_engine_sdk::abi::LLMR_LOG_WARN,
        llama_cpp_sys_2::GGML_LOG_LEVEL_INFO => llmr_engine_sdk::abi::LLMR_LOG_DEBUG,
        _ => llmr_engine_sdk::abi::LLMR_LOG_TRACE,
    };
    if let Some((_, logger)) = lock_loggers().last() {
        logger.log(level, line);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn cache_sizes_are_read_from_llama_cpp_s_report() {
        let line = "llama_kv_cache: size =   96.00 MiB (  8192 cells,   3 layers,  4/4 seqs), K (f16):   48.00 MiB, V (f16):   48.00 MiB";
        assert_eq!(super::cache_mib(line), Some(96.0));
        assert_eq!(super::cache_mib("llama_memory_recurrent: size =    1.50 MiB (     1 cells, ..."), Some(1.5));
        assert_eq!(super::cache_mib("llama_context: n_ctx = 8192"), None);
    }
}
