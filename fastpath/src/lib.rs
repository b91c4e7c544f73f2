//! The kernel fast path: an `SK_REUSEPORT` eBPF program (`bpf/steer.bpf.c`) attached
//! to one listen address's SO_REUSEPORT group. For a QUIC short header whose DCID
//! carries a live server id under a SipHash generation it selects the owning worker's
//! own UDP socket (a member of the same group) from a `REUSEPORT_SOCKARRAY`;
//! everything else — long headers, malformed or short datagrams, `cr` = 3, inactive
//! or HMAC generations, ids without a live worker, worker sockets that are gone — goes
//! to a data-plane shard socket, chosen by the 4-tuple hash or (`--steer cpu`) by the
//! CPU. A GSO/GRO train (several datagrams in one skb) goes to the worker only when
//! every datagram is provably its own ([`Variant`]; docs/adr/0004 "Trains"). The maps
//! are described in the program's header comment; their value types and the named
//! counters live in `bpf/steer.h`, which the program includes and `abi` (bindgen's
//! output, checked by tests/abi.rs) gives Rust.
//!
//! # Why libbpf-rs
//! libbpf knows the `sk_reuseport` section, BTF-defined maps and
//! `REUSEPORT_SOCKARRAY`, lets us resize maps before load
//! (`OpenMapMut::set_max_entries`), and the program is plain C built by the system
//! clang against libbpf-dev's `bpf_helpers.h`, so the C is the single source of
//! truth and can be inspected with `bpftool`. aya can express both types only in its
//! newest releases (`SkReuseport` / `ReusePortSockArray`) and would have us write the
//! program in Rust with a nightly BPF toolchain, which this build cannot fetch.
//! Attaching needs no library support at all: it is
//! `setsockopt(SOL_SOCKET, SO_ATTACH_REUSEPORT_EBPF, prog_fd)` on one socket of the
//! group. libbpf-sys builds its vendored libbpf (needs libelf-dev, zlib1g-dev,
//! pkg-config: tools/install-deps).
//!
//! # Lifetime of the attached program
//! The program belongs to the reuseport group, not to [`Steering`]: dropping a
//! `Steering` (or the data plane crashing) leaves it attached and its maps alive
//! (the kernel holds references), frozen in their last state. That is deliberate:
//! established connections keep reaching their workers' sockets while no data plane
//! runs; non-fast datagrams find no shard socket and are dropped (counted
//! `shard_select_failed`) — there is nobody to handle them anyway. A new data plane
//! binding new shard sockets to the same address joins the same group (the workers'
//! sockets keep it alive) and its `attach` replaces the old program. When the last
//! socket of the group closes the program goes with it. To detach explicitly call
//! [`detach`] on any socket of the group (the kernel then hashes over all sockets,
//! workers' included, so only do that when no worker socket is in the group).
//!
//! Integration notes: worker sockets must not be `connect()`ed (a group with
//! connected sockets makes the kernel score sockets after the program ran), and
//! every socket of the group must belong to the same user (SO_REUSEPORT rule).

use std::collections::VecDeque;
use std::ffi::OsStr;
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::{Mutex, OnceLock};

use libbpf_rs::{MapCore, MapFlags, MapHandle, Object, ObjectBuilder};
use proto::cid::SipHashKey;
use proto::{Generation, ServerId};

/// The kernel-user ABI: bindgen's output for `bpf/steer.h` (tests/abi.rs keeps it so).
#[rustfmt::skip]
#[allow(non_camel_case_types, dead_code, clippy::all)]
mod abi;

/// What a CID decode costs in eBPF, under BPF_PROG_TEST_RUN (benches and tests only;
/// docs/adr/0007-quic-lb.md).
pub mod cid_cost;

/// The program's outcome counters (`struct steer_counters` of `bpf/steer.h`), summed
/// over CPUs. Every skb the program runs on counts once among `fast`,
/// `long_header`, `short_packet`, `cr_unroutable`, `unknown_generation`,
/// `quic_lb_encrypted`, `not_live`, `train_to_shard` and `select_failed`; `fast_datagrams` and `train_fast` count
/// within `fast`, `shard_select_failed` within the others (those were dropped).
pub use abi::steer_counters as Counters;

/// The compiled variants (empty when built without clang, see build.rs).
static GSO_WALK_OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/steer_gso_walk.bpf.o"));
static SIZE_LIMIT_OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/steer_size_limit.bpf.o"));

/// Size of the `cpu_shard` table; CPUs at or above it use `cpu % shards`.
pub const CPU_SLOTS: u32 = abi::STEER_CPU_SLOTS;
/// Segments the gso-walk variant checks in one skb; a longer train goes to a shard.
pub const MAX_TRAIN_SEGMENTS: u32 = abi::STEER_MAX_TRAIN_SEGMENTS;

/// Which build of `bpf/steer.bpf.c` runs (docs/adr/0004-kernel-fast-path.md, "Trains").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// Reads each skb's GSO segment size through kfuncs (Linux >= 6.2) and steers a
    /// train to a worker only when every segment is provably that worker's.
    GsoWalk,
    /// The fallback where kfuncs are refused: any skb longer than the workers'
    /// largest UDP payload goes to a shard; a shorter train is steered by its first
    /// datagram.
    SizeLimit,
}

impl Variant {
    /// `gso-walk` or `size-limit` (logs, status).
    pub const fn name(self) -> &'static str {
        match self {
            Variant::GsoWalk => "gso-walk",
            Variant::SizeLimit => "size-limit",
        }
    }

    /// The embedded object of this variant (empty in a build without clang).
    pub fn object(self) -> &'static [u8] {
        match self {
            Variant::GsoWalk => GSO_WALK_OBJECT,
            Variant::SizeLimit => SIZE_LIMIT_OBJECT,
        }
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the program is configured with at attach time.
#[derive(Clone, Copy, Debug)]
pub struct Config<'a> {
    /// Worker slots (sockarray `shards..shards + max_workers`), at least 1.
    pub max_workers: u32,
    /// `--steer cpu`: `shard_by_cpu[cpu]` is the shard for datagrams the kernel
    /// processes on `cpu` (CPUs past the slice or at/above [`CPU_SLOTS`] use
    /// `cpu % shards`); `None` picks the shard by the 4-tuple hash.
    pub shard_by_cpu: Option<&'a [u32]>,
    /// The largest UDP payload a worker accepts (quinn's `max_udp_payload_size`,
    /// [`proto::header::MAX_UDP_PAYLOAD`]): the size-limit variant's bound.
    pub max_udp_payload: u16,
}

impl Config<'_> {
    /// `max_workers` slots, the shard by the 4-tuple hash, the workers' bound.
    pub fn new(max_workers: u32) -> Config<'static> {
        Config { max_workers, shard_by_cpu: None, max_udp_payload: proto::header::MAX_UDP_PAYLOAD }
    }
}

/// Plain map values: `#[repr(C)]` integers, or structs of them from `bpf/steer.h`
/// whose padding is explicit fields (asserted below), so all of a value's bytes are
/// initialised and every bit pattern is a valid value.
///
/// # Safety
/// Only for such types.
unsafe trait MapValue: Copy + Default {}
// SAFETY: integers.
unsafe impl MapValue for u32 {}
// SAFETY: integers.
unsafe impl MapValue for u64 {}
// SAFETY: u32, u32, u64, u64 at offsets 0, 4, 8, 16 of 24 bytes (no gap, asserted).
unsafe impl MapValue for abi::steer_gen {}
// SAFETY: four u32 in 16 bytes (no gap, asserted).
unsafe impl MapValue for abi::steer_config {}
// SAFETY: u64 fields only (`Counters::add` names them all): a struct of u64s has no
// padding.
unsafe impl MapValue for abi::steer_counters {}

const _: () = {
    assert!(std::mem::size_of::<abi::steer_gen>() == 4 + 4 + 8 + 8);
    assert!(std::mem::size_of::<abi::steer_config>() == 4 * 4);
};

/// The bytes of a map value, as the kernel copies them.
fn value_bytes<T: MapValue>(v: &T) -> &[u8] {
    // SAFETY: a MapValue has no padding, so its size_of::<T>() bytes are all
    // initialised; the slice borrows `v` and lives no longer.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
}

/// A map value from the kernel's bytes; `None` when the length is not the type's.
fn value_from<T: MapValue>(b: &[u8]) -> Option<T> {
    if b.len() != std::mem::size_of::<T>() {
        return None;
    }
    // SAFETY: `b` holds exactly size_of::<T>() bytes and any bit pattern is a valid
    // MapValue; read_unaligned does not need `b` to be aligned for T.
    Some(unsafe { std::ptr::read_unaligned(b.as_ptr().cast::<T>()) })
}

impl Counters {
    /// Adds `o` field by field (one CPU's counters into a sum, or one group's). The
    /// pattern names every field: a counter added to `bpf/steer.h` does not compile
    /// here until it is summed too.
    pub fn add(&mut self, o: &Counters) {
        let Counters {
            fast,
            fast_datagrams,
            train_fast,
            long_header,
            short_packet,
            cr_unroutable,
            unknown_generation,
            not_live,
            train_to_shard,
            select_failed,
            shard_select_failed,
            quic_lb_encrypted,
        } = *o;
        self.fast += fast;
        self.fast_datagrams += fast_datagrams;
        self.train_fast += train_fast;
        self.long_header += long_header;
        self.short_packet += short_packet;
        self.cr_unroutable += cr_unroutable;
        self.unknown_generation += unknown_generation;
        self.not_live += not_live;
        self.train_to_shard += train_to_shard;
        self.select_failed += select_failed;
        self.shard_select_failed += shard_select_failed;
        self.quic_lb_encrypted += quic_lb_encrypted;
    }

    /// The skbs the program ran on: the sum of the exclusive outcomes.
    pub fn total(&self) -> u64 {
        self.fast
            + self.long_header
            + self.short_packet
            + self.cr_unroutable
            + self.unknown_generation
            + self.quic_lb_encrypted
            + self.not_live
            + self.train_to_shard
            + self.select_failed
    }
}

/// How the program reads one key generation's CIDs (`struct steer_gen`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GenSteering {
    /// Not decoded here (not live, or ADR 0001 with hmac-sha256): to a shard.
    Inactive,
    /// ADR 0001 with siphash-2-4 (ADR 0004).
    SipHash(SipHashKey),
    /// Plaintext QUIC-LB (docs/adr/0007-quic-lb.md): the server id in clear after a
    /// first octet of config `config_id`, `server_id_len` (2..=7) bytes, the id in
    /// the last two.
    QuicLbPlaintext { config_id: u8, server_id_len: u8 },
    /// Encrypted QUIC-LB: to a shard, counted (`quic_lb_encrypted`): no AES in the
    /// program.
    QuicLbEncrypted,
}

/// Why [`Steering::attach`] failed.
#[derive(Debug)]
pub enum LoadError {
    /// This machine (or this build) cannot run the fast path: no BPF permission
    /// (EPERM/EACCES), no BPF or no SK_REUSEPORT support (ENOSYS, EOPNOTSUPP, EINVAL),
    /// a verifier refusal, or a build without clang. `--fast-path auto` falls back to
    /// the user path.
    Unsupported(String),
    /// Anything else (bad arguments, a socket that is not in a reuseport group, …).
    Other(anyhow::Error),
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Unsupported(s) => write!(f, "kernel fast path unsupported: {s}"),
            LoadError::Other(e) => write!(f, "kernel fast path: {e:#}"),
        }
    }
}
impl std::error::Error for LoadError {}

/// Message of the [`LoadError::Unsupported`] returned by a build without clang.
pub const BUILT_WITHOUT_CLANG: &str =
    "quicdemux-fastpath was built without clang; install clang and libbpf-dev (tools/install-deps) and rebuild";

/// Classifies a failure of one attach step (`what`, e.g. "loading the program") by
/// its error kind: permission and support failures (EPERM/EACCES → PermissionDenied,
/// ENOSYS/EOPNOTSUPP → Unsupported, EINVAL → InvalidInput: an unknown program or map
/// type, or a verifier refusal) are [`LoadError::Unsupported`], the rest
/// [`LoadError::Other`]. Public so the mapping can be tested directly.
#[doc(hidden)]
pub fn classify(what: &str, kind: io::ErrorKind, detail: impl fmt::Display) -> LoadError {
    match kind {
        io::ErrorKind::PermissionDenied | io::ErrorKind::Unsupported | io::ErrorKind::InvalidInput => {
            LoadError::Unsupported(format!("{what}: {detail}"))
        }
        _ => LoadError::Other(anyhow::anyhow!("{what}: {detail}")),
    }
}

/// A raw errno → [`classify`]; ENOSYS/EOPNOTSUPP/ENOPROTOOPT count as unsupported.
#[doc(hidden)]
pub fn classify_os(what: &str, err: io::Error) -> LoadError {
    let kind = match err.raw_os_error() {
        Some(libc::ENOSYS) | Some(libc::EOPNOTSUPP) | Some(libc::ENOPROTOOPT) => io::ErrorKind::Unsupported,
        Some(libc::EPERM) | Some(libc::EACCES) => io::ErrorKind::PermissionDenied,
        Some(libc::EINVAL) => io::ErrorKind::InvalidInput,
        _ => err.kind(),
    };
    classify(what, kind, err)
}

fn libbpf_kind(e: &libbpf_rs::Error) -> io::ErrorKind {
    use libbpf_rs::ErrorKind as K;
    match e.kind() {
        K::PermissionDenied => io::ErrorKind::PermissionDenied,
        K::Unsupported => io::ErrorKind::Unsupported,
        K::InvalidInput => io::ErrorKind::InvalidInput,
        K::NotFound => io::ErrorKind::NotFound,
        K::OutOfMemory => io::ErrorKind::OutOfMemory,
        _ => io::ErrorKind::Other,
    }
}

/// The tail of libbpf's log (the verifier's output on a refusal), for error messages.
static LIBBPF_LOG: Mutex<VecDeque<String>> = Mutex::new(VecDeque::new());
/// Serialises loads (see `Steering::attach_object`).
static LOAD_LOCK: Mutex<()> = Mutex::new(());

fn capture_libbpf_log(level: libbpf_rs::PrintLevel, msg: String) {
    if matches!(level, libbpf_rs::PrintLevel::Debug) {
        return;
    }
    let mut log = LIBBPF_LOG.lock().unwrap_or_else(|e| e.into_inner());
    log.push_back(msg);
    while log.len() > 40 {
        log.pop_front();
    }
}

fn take_libbpf_log() -> String {
    let mut log = LIBBPF_LOG.lock().unwrap_or_else(|e| e.into_inner());
    let s: String = log.drain(..).collect();
    s.trim_end().to_string()
}

/// The fast path of one listen address (one reuseport group).
pub struct Steering {
    /// Owns the program and the maps (the kernel keeps both while attached).
    _obj: Object,
    gens: MapHandle,
    ids: MapHandle,
    socks: MapHandle,
    counters: MapHandle,
    worker_fast: MapHandle,
    shards: u32,
    max_workers: u32,
    variant: Variant,
    /// Why the gso-walk variant was refused, when the size-limit one runs instead.
    gso_walk_refused: Option<String>,
}

impl fmt::Debug for Steering {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Steering")
            .field("variant", &self.variant)
            .field("shards", &self.shards)
            .field("max_workers", &self.max_workers)
            .finish()
    }
}

fn map_handle(obj: &Object, name: &str) -> Result<MapHandle, LoadError> {
    let map = obj
        .maps()
        .find(|m| m.name() == OsStr::new(name))
        .ok_or_else(|| LoadError::Other(anyhow::anyhow!("map {name} missing from the BPF object")))?;
    MapHandle::try_from(&map).map_err(|e| LoadError::Other(anyhow::anyhow!("map {name}: {e}")))
}

fn map_err(e: libbpf_rs::Error) -> io::Error {
    io::Error::new(libbpf_kind(&e), e.to_string())
}

/// `bpf_map_update_elem` with the kernel's errno kept (libbpf-rs folds EBUSY into
/// "other"): `attach` must tell EBUSY (the socket still sits in a replaced
/// program's array) from real failures.
fn update_raw_errno(map: &MapHandle, key: u32, value: &[u8; 8]) -> io::Result<()> {
    let k = key.to_ne_bytes();
    // SAFETY: the map fd is live for `map`'s lifetime; key and value point at live
    // buffers of the map's key size (4) and value size (8, a socket fd as u64).
    let r = unsafe {
        libbpf_rs::libbpf_sys::bpf_map_update_elem(
            map.as_fd().as_raw_fd(),
            k.as_ptr().cast(),
            value.as_ptr().cast(),
            libbpf_rs::libbpf_sys::BPF_ANY.into(),
        )
    };
    if r < 0 {
        Err(io::Error::from_raw_os_error(-r))
    } else {
        Ok(())
    }
}

/// `map[key] = value` for an ARRAY-like map of `u32` keys.
fn update<T: MapValue>(map: &MapHandle, key: u32, value: &T) -> io::Result<()> {
    map.update(&key.to_ne_bytes(), value_bytes(value), MapFlags::ANY).map_err(map_err)
}

/// The values of a per-CPU map entry, one per possible CPU.
fn lookup_percpu<T: MapValue>(map: &MapHandle, key: u32) -> io::Result<Vec<T>> {
    let raw = map.lookup_percpu(&key.to_ne_bytes(), MapFlags::ANY).map_err(map_err)?.unwrap_or_default();
    raw.iter()
        .map(|b| {
            value_from(b).ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidData, format!("per-CPU value of {} bytes", b.len()))
            })
        })
        .collect()
}

/// SKB_GSO_FRAGLIST of the running kernel, read from its BTF (0 when it has none):
/// a member of an anonymous enum, which CO-RE cannot relocate inside the program,
/// and whose bits have moved between kernel versions.
fn gso_fraglist_bit() -> u32 {
    static BIT: OnceLock<u32> = OnceLock::new();
    *BIT.get_or_init(|| {
        let Ok(btf) = libbpf_rs::btf::Btf::from_vmlinux() else { return 0 };
        let name = Some(OsStr::new("SKB_GSO_FRAGLIST"));
        let value = btf
            .type_by_kind::<libbpf_rs::btf::types::Enum<'_>>()
            .find_map(|e| e.iter().find(|m| m.name == name).map(|m| m.value));
        value.and_then(|v| u32::try_from(v).ok()).unwrap_or(0)
    })
}

use sys::sockopt::setsockopt_int;

/// How long `attach` waits for the kernel to free a replaced program's socket array
/// (an RCU grace period and a work item; milliseconds in practice).
const SHARD_INSERT_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

impl Steering {
    /// Loads the program, puts `shard_sockets[i]` at sockarray index `i`, and attaches
    /// the program to their reuseport group (all shard sockets must be bound to the
    /// same address with SO_REUSEPORT). Tries the gso-walk variant first and falls
    /// back to the size-limit one when this kernel refuses it (no kfuncs, no BTF);
    /// [`Steering::variant`] tells which runs.
    pub fn attach(shard_sockets: &[BorrowedFd<'_>], config: &Config<'_>) -> Result<Steering, LoadError> {
        match Self::attach_variant(Variant::GsoWalk, shard_sockets, config) {
            Err(LoadError::Unsupported(why)) => {
                let mut s = Self::attach_variant(Variant::SizeLimit, shard_sockets, config)?;
                s.gso_walk_refused = Some(why);
                Ok(s)
            }
            r => r,
        }
    }

    /// [`Steering::attach`] with one given variant (no fallback).
    pub fn attach_variant(
        variant: Variant,
        shard_sockets: &[BorrowedFd<'_>],
        config: &Config<'_>,
    ) -> Result<Steering, LoadError> {
        Self::attach_object(variant.object(), variant, shard_sockets, config)
    }

    /// [`Steering::attach_variant`] with another object file (tests: an empty object
    /// is what a build without clang embeds).
    #[doc(hidden)]
    pub fn attach_object(
        object: &[u8],
        variant: Variant,
        shard_sockets: &[BorrowedFd<'_>],
        config: &Config<'_>,
    ) -> Result<Steering, LoadError> {
        let other = |s: String| LoadError::Other(anyhow::anyhow!(s));
        let shards = u32::try_from(shard_sockets.len()).map_err(|_| other("too many shard sockets".into()))?;
        if shards == 0 {
            return Err(other("at least one shard socket is needed".into()));
        }
        let max_workers = config.max_workers.max(1);
        let socks_len = shards
            .checked_add(max_workers)
            .filter(|&n| n <= 1 << 20)
            .ok_or_else(|| other(format!("{shards} shards + {max_workers} workers: too many sockets")))?;
        if let Some(t) = config.shard_by_cpu {
            if let Some(bad) = t.iter().find(|&&s| s >= shards) {
                return Err(other(format!("cpu shard table names shard {bad} of {shards}")));
            }
        }
        // Caller errors first: they are errors whatever this build can do.
        if object.is_empty() {
            return Err(LoadError::Unsupported(BUILT_WITHOUT_CLANG.to_string()));
        }

        // libbpf's print callback is process-global: one load at a time, so the log
        // (the verifier's output on a refusal) is this load's and the previous
        // callback is restored.
        let serial = LOAD_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let _ = take_libbpf_log();
        let prev = libbpf_rs::set_print(Some((libbpf_rs::PrintLevel::Info, capture_libbpf_log)));
        let loaded = (|| {
            let mut open = ObjectBuilder::default()
                .open_memory(object)
                .map_err(|e| classify("opening the BPF object", libbpf_kind(&e), format!("{e:#}")))?;
            for mut m in open.maps_mut() {
                let n = if m.name() == OsStr::new("socks") {
                    socks_len
                } else if m.name() == OsStr::new("worker_fast") {
                    max_workers
                } else {
                    continue;
                };
                m.set_max_entries(n).map_err(|e| other(format!("sizing map: {e}")))?;
            }
            open.load().map_err(|e| {
                let log = take_libbpf_log();
                classify(
                    &format!("loading the SK_REUSEPORT program ({variant})"),
                    libbpf_kind(&e),
                    format!("{e:#}\n{log}"),
                )
            })
        })();
        libbpf_rs::set_print(prev);
        let _ = take_libbpf_log();
        drop(serial);
        let obj = loaded?;

        let steering = Steering {
            gens: map_handle(&obj, "gens")?,
            ids: map_handle(&obj, "ids")?,
            socks: map_handle(&obj, "socks")?,
            counters: map_handle(&obj, "counters")?,
            worker_fast: map_handle(&obj, "worker_fast")?,
            shards,
            max_workers,
            variant,
            gso_walk_refused: None,
            _obj: obj,
        };
        let config_map = map_handle(&steering._obj, "config")?;
        let cpu_shard = map_handle(&steering._obj, "cpu_shard")?;
        let io_other = |what: &str, e: io::Error| LoadError::Other(anyhow::Error::new(e).context(what.to_string()));

        let cfg = abi::steer_config {
            shard_count: shards,
            by_cpu: config.shard_by_cpu.is_some().into(),
            max_udp_payload: config.max_udp_payload.into(),
            gso_fraglist: gso_fraglist_bit(),
        };
        update(&config_map, 0, &cfg).map_err(|e| io_other("writing config", e))?;
        for cpu in 0..CPU_SLOTS {
            let s = config.shard_by_cpu.and_then(|t| t.get(cpu as usize).copied()).unwrap_or(cpu % shards);
            update(&cpu_shard, cpu, &s).map_err(|e| io_other("writing cpu_shard", e))?;
        }
        let prog = steering
            ._obj
            .progs()
            .find(|p| p.name() == OsStr::new("steer"))
            .ok_or_else(|| other("program steer missing from the BPF object".into()))?;
        let prog_fd = prog.as_fd().as_raw_fd();
        setsockopt_int(shard_sockets[0], libc::SOL_SOCKET, libc::SO_ATTACH_REUSEPORT_EBPF, prog_fd)
            .map_err(|e| classify_os("SO_ATTACH_REUSEPORT_EBPF", e))?;
        // Only now the shard sockets: a socket sits in one sockarray at a time (EBUSY
        // otherwise), and after a data-plane restart they still sit in the previous
        // program's array, which the kernel frees (asynchronously) once the attach
        // above has replaced that program. Until they are in, shard selections fail:
        // counted drops for a moment, never a datagram for the wrong socket.
        for (i, fd) in shard_sockets.iter().enumerate() {
            let v = fd.as_raw_fd() as u64;
            let deadline = std::time::Instant::now() + SHARD_INSERT_WAIT;
            loop {
                match update_raw_errno(&steering.socks, i as u32, &v.to_ne_bytes()) {
                    Ok(()) => break,
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) && std::time::Instant::now() < deadline => {
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                    Err(e) => return Err(io_other(&format!("putting shard socket {i} into the sockarray"), e)),
                }
            }
        }
        Ok(steering)
    }

    /// The variant that runs.
    pub fn variant(&self) -> Variant {
        self.variant
    }

    /// Why the gso-walk variant was refused, when [`Steering::attach`] fell back to
    /// the size-limit one.
    pub fn gso_walk_refused(&self) -> Option<&str> {
        self.gso_walk_refused.as_deref()
    }

    /// Number of shard sockets (sockarray 0..shards).
    pub fn shards(&self) -> u32 {
        self.shards
    }

    /// Worker slots (sockarray shards..shards + max_workers).
    pub fn max_workers(&self) -> u32 {
        self.max_workers
    }

    /// Makes generation `g` decodable in the kernel with its SipHash-2-4 key
    /// ([`proto::KeySet::siphash_key`]: derived from the generation's secret in user
    /// space), or inactive (`None`: not live, or a generation whose PRF is
    /// hmac-sha256).
    pub fn set_generation(&self, g: Generation, key: Option<SipHashKey>) -> io::Result<()> {
        self.set_generation_as(g, key.map_or(GenSteering::Inactive, GenSteering::SipHash))
    }

    /// How the program reads generation `g`'s CIDs ([`GenSteering`]).
    pub fn set_generation_as(&self, g: Generation, how: GenSteering) -> io::Result<()> {
        let v = match how {
            GenSteering::Inactive => abi::steer_gen::default(),
            GenSteering::SipHash(SipHashKey { k0, k1 }) => {
                abi::steer_gen { active: abi::STEER_GEN_SIPHASH, k0, k1, ..Default::default() }
            }
            GenSteering::QuicLbPlaintext { config_id, server_id_len } => {
                if !(2..=7).contains(&server_id_len) || config_id > 6 {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("quic-lb config {config_id}, server-id length {server_id_len}: not steerable"),
                    ));
                }
                abi::steer_gen {
                    active: abi::STEER_GEN_QUIC_LB_PLAINTEXT,
                    quic_lb_config_id: config_id,
                    quic_lb_server_id_len: server_id_len,
                    ..Default::default()
                }
            }
            GenSteering::QuicLbEncrypted => {
                abi::steer_gen { active: abi::STEER_GEN_QUIC_LB_ENCRYPTED, ..Default::default() }
            }
        };
        update(&self.gens, g.get().into(), &v)
    }

    fn check_slot(&self, slot: u32) -> io::Result<u32> {
        if slot >= self.max_workers {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("worker slot {slot} out of 0..{}", self.max_workers),
            ));
        }
        Ok(self.shards + slot)
    }

    /// Steers `server_id`'s fast datagrams to `sock` (a UDP socket bound to the listen
    /// address with SO_REUSEPORT, see [`open_worker_socket`]) in worker slot `slot`:
    /// `socks[shards + slot] = sock`, then `ids[server_id] = shards + slot + 1`. The
    /// slot's `worker_fast` count restarts at 0. The map keeps its own reference to
    /// the socket; when the socket is closed it leaves the map by itself.
    pub fn insert_worker(&self, slot: u32, server_id: ServerId, sock: BorrowedFd<'_>) -> io::Result<()> {
        let idx = self.check_slot(slot)?;
        let cpus = libbpf_rs::num_possible_cpus().map_err(map_err)?;
        let zeros = vec![value_bytes(&0u64).to_vec(); cpus];
        self.worker_fast.update_percpu(&slot.to_ne_bytes(), &zeros, MapFlags::ANY).map_err(map_err)?;
        update(&self.socks, idx, &(sock.as_raw_fd() as u64))?;
        update(&self.ids, server_id.0.into(), &(idx + 1))
    }

    /// Stops steering: `ids[server_id] = 0` (only if it still names `slot`, so removing
    /// an old slot never unsteers a re-inserted id), then empties `socks[shards + slot]`
    /// (already empty when the socket was closed: fine).
    pub fn remove_worker(&self, slot: u32, server_id: ServerId) -> io::Result<()> {
        let idx = self.check_slot(slot)?;
        let key = u32::from(server_id.0).to_ne_bytes();
        let cur = self.ids.lookup(&key, MapFlags::ANY).map_err(map_err)?;
        if cur.as_deref().and_then(value_from::<u32>) == Some(idx + 1) {
            update(&self.ids, server_id.0.into(), &0u32)?;
        }
        match self.socks.delete(&idx.to_ne_bytes()) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == libbpf_rs::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(map_err(e)),
        }
    }

    /// The outcome counters, summed over CPUs.
    pub fn counters(&self) -> io::Result<Counters> {
        let mut sum = Counters::default();
        for c in lookup_percpu::<Counters>(&self.counters, 0)? {
            sum.add(&c);
        }
        Ok(sum)
    }

    /// Datagrams delivered to worker slot `slot` since its last `insert_worker` (a
    /// train counts its segments), summed over CPUs.
    pub fn worker_fast(&self, slot: u32) -> io::Result<u64> {
        self.check_slot(slot)?;
        Ok(lookup_percpu::<u64>(&self.worker_fast, slot)?.iter().sum())
    }
}

/// Detaches whatever reuseport program the group of `sock` has
/// (SO_DETACH_REUSEPORT_BPF). ENOENT (nothing attached) is not an error.
pub fn detach(sock: BorrowedFd<'_>) -> io::Result<()> {
    match setsockopt_int(sock, libc::SOL_SOCKET, libc::SO_DETACH_REUSEPORT_BPF, 0) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        r => r,
    }
}

/// A UDP socket for the fast path: SO_REUSEPORT (and IPV6_V6ONLY for v6), bound to
/// `addr`, non-blocking, close-on-exec. Use it for worker sockets (and shard sockets)
/// of the listen address's group; port 0 binds an ephemeral port that the rest of the
/// group then binds explicitly.
pub fn open_worker_socket(addr: SocketAddr) -> io::Result<OwnedFd> {
    let family = if addr.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    // SAFETY: plain socket(2) call; `owned` checks the result.
    let fd =
        sys::owned(unsafe { libc::socket(family, libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0) })?;
    setsockopt_int(fd.as_fd(), libc::SOL_SOCKET, libc::SO_REUSEPORT, 1)?;
    if addr.is_ipv6() {
        setsockopt_int(fd.as_fd(), libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 1)?;
    }
    sys::addr::bind(fd.as_raw_fd(), &addr)?;
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steering_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Steering>();
    }

    #[test]
    fn objects_are_embedded_when_clang_is_there() {
        // build.rs panics on a compile error, so an empty object means no clang.
        for v in [Variant::GsoWalk, Variant::SizeLimit] {
            if v.object().is_empty() {
                testkit::skip("built without clang");
                return;
            }
            assert_eq!(&v.object()[..4], b"\x7fELF", "{v}");
        }
        assert_ne!(GSO_WALK_OBJECT, SIZE_LIMIT_OBJECT);
    }

    /// Map values are their fields' bytes, in the header's order.
    #[test]
    fn map_values_round_trip_through_bytes() {
        let g = abi::steer_gen {
            active: 2,
            quic_lb_config_id: 4,
            quic_lb_server_id_len: 3,
            pad: 0,
            k0: 0x0102_0304_0506_0708,
            k1: u64::MAX - 5,
        };
        let b = value_bytes(&g);
        let at = |offset: usize, len: usize| &b[offset..offset + len];
        assert_eq!(b.len(), std::mem::size_of::<abi::steer_gen>());
        assert_eq!(at(std::mem::offset_of!(abi::steer_gen, active), 4), &2u32.to_ne_bytes());
        assert_eq!(at(std::mem::offset_of!(abi::steer_gen, quic_lb_config_id), 2), &[4, 3]);
        assert_eq!(at(std::mem::offset_of!(abi::steer_gen, k0), 8), &g.k0.to_ne_bytes());
        assert_eq!(at(std::mem::offset_of!(abi::steer_gen, k1), 8), &g.k1.to_ne_bytes());
        assert_eq!(value_from::<abi::steer_gen>(b), Some(g));
        assert_eq!(value_from::<abi::steer_gen>(&b[..23]), None);
        let c = Counters { fast: 3, shard_select_failed: 9, quic_lb_encrypted: 5, ..Counters::default() };
        let mut sum = c;
        sum.add(&c);
        assert_eq!((sum.fast, sum.shard_select_failed, sum.not_live, sum.quic_lb_encrypted), (6, 18, 0, 10));
        assert_eq!(sum.total(), 6 + 10, "quic_lb_encrypted is an outcome, shard_select_failed is not");
        assert_eq!(value_from::<Counters>(value_bytes(&sum)), Some(sum));
    }
}
