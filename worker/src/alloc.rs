//! Giving freed heap memory back to the OS after a load peak.
//!
//! glibc malloc keeps what a burst of connections freed: small chunks stay in each
//! thread's arena and only the top of an arena is returned, so after an Initial flood
//! the worker's RSS stays at its peak (measured in docs/worker.md). `malloc_trim(0)`
//! releases the free pages of every arena (`madvise(MADV_DONTNEED)` on whole free
//! pages, not just the top). [`trim_after_peaks`] calls it only while the number of
//! open connections falls, and for a few seconds after (closing connections are freed
//! when quinn drops them, up to 3 PTOs later: RFC 9000 §10.2), so an idle or a steady
//! worker never pays for it.

use std::time::Duration;

/// `malloc_trim(0)`; false where it does not exist (not glibc) or freed nothing.
pub fn trim() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim takes no pointers from us; it walks glibc's own arenas
        // under their locks and may be called from any thread at any time.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// Ticks after the last fall in open connections during which we still trim.
const SETTLE_TICKS: u32 = 5;

/// Every `tick`, trims the heap if `open()` fell since the previous tick, and for
/// [`SETTLE_TICKS`] ticks after. Runs forever.
pub async fn trim_after_peaks(open: impl Fn() -> usize, tick: Duration) {
    let mut last = open();
    let mut since_fall = SETTLE_TICKS;
    loop {
        tokio::time::sleep(tick).await;
        let now = open();
        if now < last {
            since_fall = 0;
        }
        last = now;
        if since_fall < SETTLE_TICKS {
            since_fall += 1;
            let released = tokio::task::spawn_blocking(trim).await.unwrap_or(false);
            tracing::debug!(open = now, released, "malloc_trim");
        }
    }
}
