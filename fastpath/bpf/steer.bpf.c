// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * quicdemux kernel fast path: an SK_REUSEPORT program attached to one listen
 * address's SO_REUSEPORT group. It decodes the server id of a QUIC short header
 * in the kernel and hands the skb straight to the owning worker's own UDP socket;
 * everything else goes to a data-plane shard socket
 * (docs/adr/0004-kernel-fast-path.md, "Steering in the kernel" and "Trains").
 *
 * What counts as a routable short header mirrors proto::header::parse with a
 * 12-byte DCID (RFC 9000 §17.3.1): UDP payload byte 0 has the header-form bit
 * (0x80) clear and the fixed bit (0x40) set, and the datagram holds the 1-byte
 * header, the 12-byte DCID and at least 20 more bytes (the header-protection
 * sample, RFC 9001 §5.4.2): length >= 33.
 *
 * The CID (ADR 0001): byte 0 = cr (2 bits) | 6 random bits, bytes 1..=8 nonce,
 * bytes 9..=10 = server id (big-endian) XOR mask; the mask is SipHash-2-4 of
 * bytes 0..=8 under the generation's key (bpf/siphash.h). k0/k1 are derived from
 * the generation's secret in user space; the secret never reaches the kernel.
 *
 * A generation may be a QUIC-LB one instead (docs/adr/0007-quic-lb.md): its
 * 12-byte CIDs start with a config id whose top two bits are the generation, so
 * cr still picks the generation. A plaintext one carries the server id in clear
 * (bytes 1..=server-id length, the id in the last two, the others zero); an
 * encrypted one goes to a shard, counted (quic_lb_encrypted): no AES here.
 *
 * Trains: one skb may carry several datagrams of one 4-tuple (a UDP GSO send on
 * loopback, or a receive-side GRO train). The program runs once for the whole skb,
 * so it may steer it to a worker only if every datagram in it belongs there.
 * This file builds two variants (build.rs):
 *   STEER_GSO_WALK  reads the skb's gso_size / gso_type through kfuncs (Linux
 *                   >= 6.2) and walks the segments: fast only when every segment
 *                   is a routable short header whose DCID equals the first's or
 *                   decodes to the same server id; otherwise the skb goes to a
 *                   shard, which splits it and routes each datagram.
 *   (without)       size-limit: any skb whose UDP payload is longer than
 *                   config.max_udp_payload goes to a shard. A train no longer
 *                   than that is still steered by its first datagram (ADR 0004).
 *
 * Maps (the loader, src/lib.rs, finds them by these names; value types in
 * bpf/steer.h):
 *   gens       ARRAY[3] of struct steer_gen, by cr.
 *   ids        ARRAY[65536] of u32, by server id: sockarray index + 1 of the
 *              worker's socket, 0 = not live.
 *   socks      REUSEPORT_SOCKARRAY: 0..shard_count-1 = data-plane shard sockets,
 *              shard_count + slot = worker slot's socket. max_entries is set by
 *              the loader before load (shards + max workers).
 *   config     ARRAY[1] of struct steer_config.
 *   cpu_shard  ARRAY[STEER_CPU_SLOTS] of u32: when by_cpu, the shard for the CPU
 *              running the program (the data plane's --steer cpu). CPUs beyond
 *              use cpu mod shard_count. When !by_cpu the shard is
 *              ctx->hash % shard_count, the 4-tuple hash, so one flow always
 *              lands on one shard.
 *   counters   PERCPU_ARRAY[1] of struct steer_counters.
 *   worker_fast PERCPU_ARRAY[max workers] of u64: datagrams handed to each
 *              worker slot (a train counts its segments). max_entries set by
 *              the loader before load.
 *
 * If even the shard select fails (a shard socket closed while the program is
 * attached, or shard_count 0) the skb is dropped and counted
 * (shard_select_failed). SK_PASS without a selection would let the kernel hash
 * over the whole group, worker sockets included, i.e. hand a datagram to a
 * process that does not own it; a counted drop is visible and QUIC recovers.
 */
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "steer.h"
#include "siphash.h"

#define IPPROTO_UDP_ 17
#define UDP_HDR_LEN 8
#define CID_LEN 12
/* 1 header byte + 12-byte DCID + 20 bytes (proto::header::MIN_AFTER_PN_OFFSET). */
#define MIN_SHORT_PAYLOAD (1 + CID_LEN + 20)
#define CR_UNROUTABLE 3
/* Not a server id (ids are 16 bits): never in the ids map. */
#define NO_SERVER_ID 0x10000

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, STEER_GENERATIONS);
	__type(key, __u32);
	__type(value, struct steer_gen);
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
	__type(value, struct steer_config);
} config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, STEER_CPU_SLOTS);
	__type(key, __u32);
	__type(value, __u32);
} cpu_shard SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct steer_counters);
} counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1); /* set by the loader */
	__type(key, __u32);
	__type(value, __u64);
} worker_fast SEC(".maps");

/* The server id of a 12-byte DCID under generation g (active: SIPHASH or
 * QUIC_LB_PLAINTEXT), or NO_SERVER_ID. Plaintext QUIC-LB (draft-21 §5.4.1 without
 * a key; ADR 0007): the first octet's top three bits are g's config id, then
 * quic_lb_server_id_len bytes of server id: zeros, then the 16-bit id. */
static __always_inline __u32 gen_server_id(const struct steer_gen *g, const __u8 *cid)
{
	__u32 n, j, hi = 0, lo = 0;
	__u8 zeros = 0;

	if (g->active == STEER_GEN_SIPHASH)
		return cid_server_id(g->k0, g->k1, cid);
	if (g->active != STEER_GEN_QUIC_LB_PLAINTEXT || (cid[0] >> 5) != g->quic_lb_config_id)
		return NO_SERVER_ID;
	n = g->quic_lb_server_id_len;
	if (n < 2 || n > 7)
		return NO_SERVER_ID;
	/* Constant indices only: bytes 1..n-2 zero, n-1 and n the id. */
#pragma unroll
	for (j = 1; j <= 7; j++) {
		if (j + 1 < n)
			zeros |= cid[j];
		else if (j + 1 == n)
			hi = cid[j];
		else if (j == n)
			lo = cid[j];
	}
	if (zeros)
		return NO_SERVER_ID;
	return (hi << 8) | lo;
}

#ifdef STEER_GSO_WALK
#include <bpf/bpf_core_read.h>

/* CO-RE views of the kernel's own structs: libbpf relocates the field offsets
 * against the running kernel's BTF at load. */
struct sk_buff {
	unsigned char *head;
	unsigned int end; /* sk_buff_data_t: an offset from head on 64-bit */
} __attribute__((preserve_access_index));

struct skb_shared_info {
	unsigned short gso_size;
	unsigned short gso_segs;
	unsigned int gso_type;
} __attribute__((preserve_access_index));

struct sk_reuseport_kern {
	struct sk_buff *skb;
} __attribute__((preserve_access_index));

extern void *bpf_cast_to_kern_ctx(void *obj) __ksym;
extern void *bpf_rdonly_cast(const void *obj, __u32 btf_id) __ksym;

/* The skb's GSO segment size (0: one datagram) and GSO type bits: its
 * skb_shared_info lives at head + end. */
static __always_inline void gso_info(struct sk_reuseport_md *ctx, __u32 *size, __u32 *type)
{
	struct sk_reuseport_kern *k = bpf_cast_to_kern_ctx(ctx);
	struct sk_buff *skb = k->skb;
	struct skb_shared_info *sh =
		bpf_rdonly_cast(skb->head + skb->end, bpf_core_type_id_kernel(struct skb_shared_info));

	*size = sh->gso_size;
	*type = sh->gso_type;
}

/* One train's walk (bpf_loop's callback state): segment i sits at UDP payload
 * offset i * gso_size and holds gso_size bytes, the last one possibly fewer. */
struct train_walk {
	struct sk_reuseport_md *ctx;
	__u32 id;       /* the first segment's server id */
	__u32 gso_size;
	__u32 payload;  /* UDP payload bytes of the whole skb */
	__u32 segs;     /* <= STEER_MAX_TRAIN_SEGMENTS */
	__u32 one_owner; /* the result: 1 when every segment passed */
	__u8 first[CID_LEN]; /* the first segment's DCID */
};

/* Checks segment i + 1 (segment 0 was checked by the caller): a routable short
 * header whose DCID equals the first segment's (no second SipHash) or decodes,
 * under an active generation, to the same server id. Returns 1 (stop) at the first
 * segment that fails (one_owner stays 0) or past the last one (one_owner = 1). */
static long check_segment(__u64 i, void *data)
{
	struct train_walk *w = data;
	__u8 seg[1 + CID_LEN]; /* header byte, then the DCID */
	struct steer_gen *g;
	__u32 n = (__u32)i + 1, off, cr, j;
	__u8 diff = 0;

	if (n >= w->segs) {
		w->one_owner = 1;
		return 1;
	}
	off = n * w->gso_size;
	if (off >= w->payload || w->payload - off < MIN_SHORT_PAYLOAD)
		return 1;
	if (bpf_skb_load_bytes(w->ctx, UDP_HDR_LEN + off, seg, sizeof(seg)) != 0)
		return 1;
	if ((seg[0] & 0xc0) != 0x40)
		return 1;
#pragma unroll
	for (j = 0; j < CID_LEN; j++)
		diff |= seg[1 + j] ^ w->first[j];
	if (diff == 0)
		return 0;
	cr = seg[1] >> 6;
	if (cr == CR_UNROUTABLE)
		return 1;
	g = bpf_map_lookup_elem(&gens, &cr);
	if (!g || g->active == STEER_GEN_INACTIVE || g->active == STEER_GEN_QUIC_LB_ENCRYPTED)
		return 1;
	return gen_server_id(g, seg + 1) == w->id ? 0 : 1;
}

/* Whether every segment of a train belongs to worker `id` (see check_segment). */
static __always_inline int train_has_one_owner(struct sk_reuseport_md *ctx, const __u8 *first, __u32 id,
					       __u32 gso_size, __u32 payload, __u32 segs)
{
	struct train_walk w = {
		.ctx = ctx, .id = id, .gso_size = gso_size, .payload = payload, .segs = segs, .one_owner = 0,
	};

	__builtin_memcpy(w.first, first, CID_LEN);
	/* Calls for segments 1..segs-1, then one more that sees n == segs. */
	bpf_loop(STEER_MAX_TRAIN_SEGMENTS, check_segment, &w, 0);
	return w.one_owner;
}
#endif /* STEER_GSO_WALK */

/* Hands the skb to a data-plane shard socket. */
static __always_inline int to_shard(struct sk_reuseport_md *ctx, const struct steer_config *cfg,
				    struct steer_counters *c)
{
	__u32 n = cfg->shard_count;
	__u32 shard;

	if (n == 0) {
		c->shard_select_failed += 1;
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
	c->shard_select_failed += 1;
	return SK_DROP;
}

SEC("sk_reuseport")
int steer(struct sk_reuseport_md *ctx)
{
	__u32 zero = 0;
	struct steer_config *cfg = bpf_map_lookup_elem(&config, &zero);
	struct steer_counters *c = bpf_map_lookup_elem(&counters, &zero);
	__u8 buf[1 + CID_LEN]; /* header byte, then the DCID */
	const __u8 *cid = buf + 1;
	__u32 payload, first_len, segs = 1, cr, id, idx, slot;
	struct steer_gen *g;
	__u64 *outcome, *wf;
	__u32 *v;
#ifdef STEER_GSO_WALK
	__u32 gso_size = 0, gso_type = 0;
#endif

	if (!cfg || !c) /* cannot happen: an ARRAY always has key 0 */
		return SK_DROP;
	if (ctx->ip_protocol != IPPROTO_UDP_ || ctx->len < UDP_HDR_LEN + 1 ||
	    bpf_skb_load_bytes(ctx, UDP_HDR_LEN, buf, 1) != 0) {
		outcome = &c->short_packet;
		goto shard;
	}
	payload = ctx->len - UDP_HDR_LEN;
	first_len = payload;
#ifdef STEER_GSO_WALK
	gso_info(ctx, &gso_size, &gso_type);
	if (gso_size != 0 && payload > gso_size) {
		first_len = gso_size;
		segs = (payload + gso_size - 1) / gso_size;
	}
#endif
	if (buf[0] & 0x80) {
		outcome = &c->long_header;
		goto shard;
	}
	if (!(buf[0] & 0x40) || first_len < MIN_SHORT_PAYLOAD ||
	    bpf_skb_load_bytes(ctx, UDP_HDR_LEN, buf, sizeof(buf)) != 0) {
		outcome = &c->short_packet;
		goto shard;
	}
	cr = cid[0] >> 6;
	if (cr == CR_UNROUTABLE) {
		outcome = &c->cr_unroutable;
		goto shard;
	}
	g = bpf_map_lookup_elem(&gens, &cr);
	if (!g || g->active == STEER_GEN_INACTIVE) {
		outcome = &c->unknown_generation;
		goto shard;
	}
	if (g->active == STEER_GEN_QUIC_LB_ENCRYPTED) {
		outcome = &c->quic_lb_encrypted;
		goto shard;
	}
	id = gen_server_id(g, cid);
	v = bpf_map_lookup_elem(&ids, &id);
	if (!v || *v <= cfg->shard_count) { /* 0 = not live; a shard index is never a worker */
		outcome = &c->not_live;
		goto shard;
	}
#ifdef STEER_GSO_WALK
	if (segs > 1 && (segs > STEER_MAX_TRAIN_SEGMENTS || (gso_type & cfg->gso_fraglist) != 0 ||
			 !train_has_one_owner(ctx, cid, id, gso_size, payload, segs))) {
		outcome = &c->train_to_shard;
		goto shard;
	}
#else
	if (payload > cfg->max_udp_payload) {
		outcome = &c->train_to_shard;
		goto shard;
	}
#endif
	idx = *v - 1;
	if (bpf_sk_select_reuseport(ctx, &socks, &idx, 0) != 0) {
		outcome = &c->select_failed;
		goto shard;
	}
	c->fast += 1;
	c->fast_datagrams += segs;
	if (segs > 1)
		c->train_fast += 1;
	slot = idx - cfg->shard_count;
	wf = bpf_map_lookup_elem(&worker_fast, &slot);
	if (wf)
		*wf += segs;
	return SK_PASS;
shard:
	*outcome += 1;
	return to_shard(ctx, cfg, c);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
