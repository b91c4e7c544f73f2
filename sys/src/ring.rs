//! The shared mapping of a forwarding ring (`--forward ring`, docs/wire.md "Ring"):
//! a memfd of `proto::ring::HEADER_LEN` header bytes and `capacity` data bytes that
//! the data plane's shard (producer) and a worker (consumer) both map, and the
//! eventfd that wakes the consumer. Layout and index arithmetic are `proto::ring`;
//! the protocol (who writes which word, when) is the producer's and the consumer's.
//!
//! The other side is another process and may write the mapping at any time: record
//! bytes are only ever copied in or out with raw copies, never borrowed as slices,
//! and header words are only accessed as atomics.

use crate::{cvt, owned};
use proto::ring::{HEADER_LEN, OFF_SLEEPING};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64};

/// One mapping of a ring's memfd, unmapped on drop.
pub struct Mapping {
    base: *mut u8,
    map_len: usize,
    capacity: u64,
    /// The CPU has PREFETCHW ([`Mapping::prefetch_for_write`]).
    prefetchw: bool,
}

/// Whether the CPU has PREFETCHW: CPUID 8000_0001h, ECX bit 8 (AMD's
/// 3DNowPrefetch, Intel's PRFCHW). Read once.
#[cfg(target_arch = "x86_64")]
fn cpu_has_prefetchw() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        use std::arch::x86_64::__cpuid;
        let max_extended = __cpuid(0x8000_0000).eax;
        max_extended >= 0x8000_0001 && __cpuid(0x8000_0001).ecx & (1 << 8) != 0
    })
}

#[cfg(not(target_arch = "x86_64"))]
fn cpu_has_prefetchw() -> bool {
    false
}

// SAFETY: the mapping is owned (unmapped in Drop only); the shared words are atomics and
// record bytes are only copied in or out, so sharing the pointer between threads is
// sound; which thread may write where is the ring protocol's (one producer, one consumer).
unsafe impl Send for Mapping {}
// SAFETY: see Send.
unsafe impl Sync for Mapping {}

impl std::fmt::Debug for Mapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mapping").field("capacity", &self.capacity).finish()
    }
}

fn invalid(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("forwarding ring: {why}"))
}

impl Mapping {
    /// A new memfd of `HEADER_LEN + capacity` bytes (all zero), mapped. Its size is
    /// sealed (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL): the other process cannot
    /// truncate it, which would turn our accesses into SIGBUS.
    pub fn create(capacity: u64) -> io::Result<(Mapping, OwnedFd)> {
        let map_len = HEADER_LEN + capacity as usize;
        // SAFETY: memfd_create with a NUL-terminated name; the fd is owned at once.
        let memfd = owned(unsafe {
            libc::memfd_create(c"quicdemux-ring".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        })?;
        // SAFETY: plain syscall on an fd we own.
        cvt(unsafe { libc::ftruncate(memfd.as_raw_fd(), map_len as libc::off_t) })?;
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: fcntl(2) F_ADD_SEALS with an int argument on an fd we own.
        cvt(unsafe { libc::fcntl(memfd.as_raw_fd(), libc::F_ADD_SEALS, seals) })?;
        Ok((Mapping::map(memfd.as_raw_fd(), map_len, capacity)?, memfd))
    }

    /// Maps a memfd another process created: it must hold at least
    /// `HEADER_LEN + capacity` bytes and be sealed against shrinking.
    pub fn open(memfd: BorrowedFd<'_>, capacity: u64) -> io::Result<Mapping> {
        let map_len = HEADER_LEN + capacity as usize;
        // SAFETY: stat is plain old data; all-zero is valid.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat(2) on a live descriptor, into `st`.
        cvt(unsafe { libc::fstat(memfd.as_raw_fd(), &mut st) })?;
        if (st.st_size as u64) < map_len as u64 {
            return Err(invalid("memfd smaller than announced"));
        }
        // SAFETY: fcntl(2) F_GET_SEALS on a live descriptor.
        let seals = cvt(unsafe { libc::fcntl(memfd.as_raw_fd(), libc::F_GET_SEALS) })?;
        if seals & libc::F_SEAL_SHRINK == 0 {
            // Whoever made it could shrink it under us (SIGBUS on access).
            return Err(invalid("memfd size not sealed (F_SEAL_SHRINK)"));
        }
        Mapping::map(memfd.as_raw_fd(), map_len, capacity)
    }

    fn map(fd: libc::c_int, map_len: usize, capacity: u64) -> io::Result<Mapping> {
        // SAFETY: a new shared mapping of the first `map_len` bytes of the memfd, which
        // is at least that large (sized or checked by the caller); MAP_FAILED checked;
        // unmapped in Drop.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping { base: base.cast(), map_len, capacity, prefetchw: cpu_has_prefetchw() })
    }

    /// Data bytes (the ring's capacity).
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The 8-byte header word at `off` (`proto::ring::OFF_*`).
    pub fn word(&self, off: usize) -> &AtomicU64 {
        assert!(off.is_multiple_of(8) && off + 8 <= HEADER_LEN);
        // SAFETY: `off` is an 8-aligned offset inside the header page of a live,
        // page-aligned mapping; AtomicU64 has the layout of u64 and every access to
        // this word, in both processes, is atomic.
        unsafe { &*(self.base.add(off) as *const AtomicU64) }
    }

    /// The consumer's *sleeping* flag (a u32 at `OFF_SLEEPING`).
    pub fn sleeping(&self) -> &AtomicU32 {
        // SAFETY: as `word`, a 4-aligned u32 in the header page.
        unsafe { &*(self.base.add(OFF_SLEEPING) as *const AtomicU32) }
    }

    /// Copies `data` to data offset `at` (in bounds: asserted). The caller owns that
    /// part of the ring under the protocol (`proto::ring::reserve`).
    pub fn write(&self, at: usize, data: &[u8]) {
        assert!(at as u64 + data.len() as u64 <= self.capacity);
        // SAFETY: in bounds (asserted) of a live mapping; a raw copy, so a concurrent
        // write by the other process cannot break any Rust reference.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.base.add(HEADER_LEN + at), data.len()) }
    }

    /// Asks the CPU to fetch the cache lines of data bytes `span` for writing
    /// (PREFETCHW), where the producer's next record goes: its copy then writes lines
    /// already held, not one store miss after another. A hint: it changes no memory
    /// and never faults; nothing on CPUs without the instruction.
    pub fn prefetch_for_write(&self, span: std::ops::Range<usize>) {
        assert!(span.start <= span.end && span.end as u64 <= self.capacity);
        if !self.prefetchw {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        for line in (span.start & !63..span.end).step_by(64) {
            // SAFETY: PREFETCHW (checked by CPUID above) of an address inside the live
            // mapping (asserted); a prefetch changes no memory and never faults.
            unsafe {
                std::arch::asm!(
                    "prefetchw [{0}]",
                    in(reg) self.base.add(HEADER_LEN + line),
                    options(nostack, preserves_flags, readonly)
                )
            };
        }
    }

    /// Copies `out.len()` bytes from data offset `at` (in bounds: asserted).
    pub fn read(&self, at: usize, out: &mut [u8]) {
        assert!(at as u64 + out.len() as u64 <= self.capacity);
        // SAFETY: in bounds (asserted) of a live mapping; a raw copy out (see `write`).
        unsafe { std::ptr::copy_nonoverlapping(self.base.add(HEADER_LEN + at), out.as_mut_ptr(), out.len()) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`; every reference into it
        // borrows `self`, so none outlives it.
        unsafe { libc::munmap(self.base.cast(), self.map_len) };
    }
}

/// A non-blocking, close-on-exec eventfd (the ring's wake-up).
pub fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd(2); the fd is owned at once.
    owned(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })
}

/// Adds one to an eventfd. EAGAIN (counter saturated) means a wake-up is pending anyway.
pub fn eventfd_signal(fd: BorrowedFd<'_>) {
    let one: u64 = 1;
    // SAFETY: write(2) of 8 bytes from a live u64.
    unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

/// Clears a non-blocking eventfd; EAGAIN (nothing pending) is fine.
pub fn eventfd_clear(fd: BorrowedFd<'_>) {
    let mut v: u64 = 0;
    // SAFETY: read(2) of 8 bytes into a live u64.
    unsafe { libc::read(fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests may panic on their own setup
mod tests {
    use super::*;

    /// The CPUID bit read is the one the kernel reports as `3dnowprefetch` (AMD) or
    /// `prfchw` (Intel).
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn prefetchw_detection_matches_the_kernel() {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap();
        let flags = cpuinfo.lines().find(|l| l.starts_with("flags")).unwrap();
        let listed = flags.split_whitespace().any(|f| f == "3dnowprefetch" || f == "prfchw");
        assert_eq!(cpu_has_prefetchw(), listed, "{flags}");
    }

    /// Prefetching any span of the data area, up to its last byte, is harmless: the
    /// bytes stay what they were.
    #[test]
    fn prefetch_for_write_changes_nothing() {
        let cap = proto::ring::MIN_CAPACITY as u64;
        let (map, _memfd) = Mapping::create(cap).unwrap();
        map.write(0, &[7u8; 64]);
        map.write(cap as usize - 8, &[9u8; 8]);
        for span in [0..64, 1..2, 0..cap as usize, cap as usize - 8..cap as usize, 5..5] {
            map.prefetch_for_write(span);
        }
        let (mut head, mut end) = ([0u8; 64], [0u8; 8]);
        map.read(0, &mut head);
        map.read(cap as usize - 8, &mut end);
        assert_eq!((head, end), ([7u8; 64], [9u8; 8]));
    }

    #[test]
    #[should_panic]
    fn prefetch_past_the_data_area_is_refused() {
        let cap = proto::ring::MIN_CAPACITY as u64;
        let (map, _memfd) = Mapping::create(cap).unwrap();
        map.prefetch_for_write(cap as usize - 8..cap as usize + 1);
    }
}
