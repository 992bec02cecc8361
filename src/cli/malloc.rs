//! glibc's allocator, set up before the first thread starts.
//!
//! glibc gives a thread that finds the allocator busy an arena of its own,
//! up to eight per core, and memory freed into one arena is not reused by
//! another. The relay's threads (tokio's workers, librdkafka's broker and
//! polling threads) allocate a record's pieces on one thread and free them on
//! another, so under load each arena keeps its own high-water mark and the
//! peak RSS grows with how often they happened to collide, so the peak
//! varied widely from run to run of the same binary. Two arenas bounded
//! that; one lowered the peak further, most in exactly-once (whose producer
//! holds a whole transaction's records until the commit), at no measurable
//! cost in drain rate in either delivery mode (docs/benchmarks.md, "One
//! malloc arena").

/// Arenas when `MALLOC_ARENA_MAX` does not say otherwise.
const ARENAS: i32 = 1;

/// Caps glibc's arenas at [`ARENAS`], unless the environment sets
/// `MALLOC_ARENA_MAX` (glibc has then applied it already). Call before any
/// thread is started: a thread keeps the arena it first got.
pub fn limit_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only sets an allocator parameter; called before
        // other threads exist, it races with no allocation.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, ARENAS);
        }
    }
}
