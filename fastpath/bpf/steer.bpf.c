// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * quicdemux kernel fast path: an SK_REUSEPORT program attached to one listen
 * address's SO_REUSEPORT group. It decodes the server id of a QUIC short header
 * in the kernel and hands the datagram straight to the owning worker's own UDP
 * socket; everything else goes to a data-plane shard socket.
 *
 * What counts as a routable short header mirrors proto::header::parse with a
 * 12-byte DCID (RFC 9000 §17.3.1): UDP payload byte 0 has the header-form bit
 * (0x80) clear and the fixed bit (0x40) set, and the payload holds the 1-byte
 * header, the 12-byte DCID and at least 20 more bytes (the header-protection
 * sample, RFC 9001 §5.4.2): payload length >= 33. Everything else is "not
 * fast" and goes to a shard, which handles it as the user path always did.
 *
 * The CID (ADR 0001): byte 0 = cr (2 bits) | 6 random bits, bytes 1..=8 nonce,
 * bytes 9..=10 = server id (big-endian) XOR mask, byte 11 random. For a
 * generation whose PRF is siphash-2-4, h = SipHash-2-4(k0, k1, cid[0..9]) and
 * mask = [h & 0xff, (h >> 8) & 0xff]. k0/k1 are derived from the generation's
 * secret in user space (HMAC-SHA-256); the secret never reaches the kernel.
 *
 * Maps (the loader, fastpath/src/lib.rs, finds them by these names):
 *   gens       ARRAY[3] of struct gen: per key generation (cr 0..2), active flag
 *              and the SipHash key. Inactive = not decodable here (rotated away,
 *              or an hmac-sha256 generation): counted unknown_generation.
 *   ids        ARRAY[65536] of u32, by server id: sockarray index + 1 of the
 *              worker's socket, 0 = not live.
 *   socks      REUSEPORT_SOCKARRAY: 0..shard_count-1 = data-plane shard sockets,
 *              shard_count + slot = worker slot's socket. max_entries is set by
 *              the loader before load (shards + max workers).
 *   config     ARRAY[1] of struct config { shard_count, by_cpu }.
 *   cpu_shard  ARRAY[256] of u32: when by_cpu, the shard for the CPU running the
 *              program (the data plane's --steer cpu). CPUs >= 256 use cpu mod
 *              shard_count. When !by_cpu the shard is ctx->hash % shard_count,
 *              the 4-tuple hash, so one flow always lands on one shard.
 *   counters   PERCPU_ARRAY[C_COUNT] of u64, one per outcome (enum below).
 *   worker_fast PERCPU_ARRAY[max workers] of u64: fast datagrams per worker slot.
 *              max_entries set by the loader before load.
 *
 * If even the shard select fails (a shard socket closed while the program is
 * attached, or shard_count 0) the datagram is dropped and counted
 * (shard_select_failed). SK_PASS without a selection would let the kernel hash
 * over the whole group, worker sockets included, i.e. hand a datagram to a
 * process that does not own it; a counted drop is visible and QUIC recovers.
 */
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#define IPPROTO_UDP_ 17
#define UDP_HDR_LEN 8
#define CID_LEN 12
/* 1 header byte + 12-byte DCID + 20 bytes (proto::header::MIN_AFTER_PN_OFFSET). */
#define MIN_SHORT_PAYLOAD (1 + CID_LEN + 20)
#define CR_UNROUTABLE 3
#define CPU_SLOTS 256

/* Counter indices: keep in sync with Counters in src/lib.rs. */
enum { /* 0, 1, 2, … in this order */
	C_FAST, C_LONG_HEADER, C_SHORT_PACKET, C_CR_UNROUTABLE, C_UNKNOWN_GENERATION,
	C_NOT_LIVE, C_SELECT_FAILED, C_SHARD_SELECT_FAILED,
	C_COUNT,
};

struct gen {
	__u32 active;
	__u32 pad;
	__u64 k0;
	__u64 k1;
};

struct config {
	__u32 shard_count;
	__u32 by_cpu;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 3);
	__type(key, __u32);
	__type(value, struct gen);
} gens SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, __u32);
} ids SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_REUSEPORT_SOCKARRAY);
	__uint(max_entries, 1); /* set by the loader */
	__type(key, __u32);
	__type(value, __u64);
} socks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct config);
} config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, CPU_SLOTS);
	__type(key, __u32);
	__type(value, __u32);
} cpu_shard SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, C_COUNT);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1); /* set by the loader */
	__type(key, __u32);
	__type(value, __u64);
} worker_fast SEC(".maps");

static __always_inline void count(__u32 what)
{
	__u64 *v = bpf_map_lookup_elem(&counters, &what);

	if (v)
		*v += 1;
}

#define ROTL(x, b) (((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                               \
	do {                                                                   \
		v0 += v1; v1 = ROTL(v1, 13); v1 ^= v0; v0 = ROTL(v0, 32);      \
		v2 += v3; v3 = ROTL(v3, 16); v3 ^= v2;                         \
		v0 += v3; v3 = ROTL(v3, 21); v3 ^= v0;                         \
		v2 += v1; v1 = ROTL(v1, 17); v1 ^= v2; v2 = ROTL(v2, 32);      \
	} while (0)

/* Reference SipHash-2-4 of a 9-byte message: one 8-byte block, then the final
 * block holding byte 8 and the length (9 << 56). */
static __always_inline __u64 siphash24_9(__u64 k0, __u64 k1, const __u8 *m)
{
	__u64 v0 = k0 ^ 0x736f6d6570736575ULL;
	__u64 v1 = k1 ^ 0x646f72616e646f6dULL;
	__u64 v2 = k0 ^ 0x6c7967656e657261ULL;
	__u64 v3 = k1 ^ 0x7465646279746573ULL;
	__u64 b0 = (__u64)m[0] | ((__u64)m[1] << 8) | ((__u64)m[2] << 16) |
		   ((__u64)m[3] << 24) | ((__u64)m[4] << 32) | ((__u64)m[5] << 40) |
		   ((__u64)m[6] << 48) | ((__u64)m[7] << 56);
	__u64 b1 = ((__u64)9 << 56) | (__u64)m[8];

	v3 ^= b0;
	SIPROUND;
	SIPROUND;
	v0 ^= b0;
	v3 ^= b1;
	SIPROUND;
	SIPROUND;
	v0 ^= b1;
	v2 ^= 0xff;
	SIPROUND;
	SIPROUND;
	SIPROUND;
	SIPROUND;
	return v0 ^ v1 ^ v2 ^ v3;
}

/* Hands the datagram to a data-plane shard socket. */
static __always_inline int to_shard(struct sk_reuseport_md *ctx, const struct config *cfg)
{
	__u32 n = cfg->shard_count;
	__u32 shard;

	if (n == 0) {
		count(C_SHARD_SELECT_FAILED);
		return SK_DROP;
	}
	if (cfg->by_cpu) {
		__u32 cpu = bpf_get_smp_processor_id();
		__u32 *s = bpf_map_lookup_elem(&cpu_shard, &cpu);

		shard = s ? *s : cpu % n;
		if (shard >= n)
			shard = shard % n;
	} else {
		shard = ctx->hash % n;
	}
	if (bpf_sk_select_reuseport(ctx, &socks, &shard, 0) == 0)
		return SK_PASS;
	count(C_SHARD_SELECT_FAILED);
	return SK_DROP;
}

SEC("sk_reuseport")
int steer(struct sk_reuseport_md *ctx)
{
	__u32 zero = 0;
	struct config *cfg = bpf_map_lookup_elem(&config, &zero);
	__u8 buf[1 + CID_LEN]; /* header byte, then the DCID */
	const __u8 *cid = buf + 1;
	__u32 len, cr, id, idx, slot, why;
	struct gen *g;
	__u32 *v;
	__u64 h, *wf;

	if (!cfg) /* cannot happen: an ARRAY always has key 0 */
		return SK_DROP;
	len = ctx->len;
	if (ctx->ip_protocol != IPPROTO_UDP_ || len < UDP_HDR_LEN + 1 ||
	    bpf_skb_load_bytes(ctx, UDP_HDR_LEN, buf, 1) != 0) {
		why = C_SHORT_PACKET;
		goto shard;
	}
	if (buf[0] & 0x80) {
		why = C_LONG_HEADER;
		goto shard;
	}
	if (!(buf[0] & 0x40) || len - UDP_HDR_LEN < MIN_SHORT_PAYLOAD ||
	    bpf_skb_load_bytes(ctx, UDP_HDR_LEN, buf, sizeof(buf)) != 0) {
		why = C_SHORT_PACKET;
		goto shard;
	}
	cr = cid[0] >> 6;
	if (cr == CR_UNROUTABLE) {
		why = C_CR_UNROUTABLE;
		goto shard;
	}
	g = bpf_map_lookup_elem(&gens, &cr);
	if (!g || !g->active) {
		why = C_UNKNOWN_GENERATION;
		goto shard;
	}
	h = siphash24_9(g->k0, g->k1, cid);
	id = ((__u32)(cid[9] ^ (__u8)(h & 0xff)) << 8) | (__u32)(cid[10] ^ (__u8)((h >> 8) & 0xff));
	v = bpf_map_lookup_elem(&ids, &id);
	if (!v || *v <= cfg->shard_count) { /* 0 = not live; a shard index is never a worker */
		why = C_NOT_LIVE;
		goto shard;
	}
	idx = *v - 1;
	if (bpf_sk_select_reuseport(ctx, &socks, &idx, 0) != 0) {
		why = C_SELECT_FAILED;
		goto shard;
	}
	count(C_FAST);
	slot = idx - cfg->shard_count;
	wf = bpf_map_lookup_elem(&worker_fast, &slot);
	if (wf)
		*wf += 1;
	return SK_PASS;
shard:
	count(why);
	return to_shard(ctx, cfg);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
