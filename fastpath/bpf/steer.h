/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * The kernel-user ABI of the quicdemux fast path (docs/adr/0004-kernel-fast-path.md):
 * the value types of the maps of bpf/steer.bpf.c. The program includes this header;
 * the loader uses the same types through src/abi.rs, which bindgen generates from
 * this file (tests/abi.rs regenerates it and fails on any difference).
 *
 * Every struct is plain integers with explicit padding, so its bytes are fully
 * defined on both sides.
 */
#ifndef QUICDEMUX_STEER_H
#define QUICDEMUX_STEER_H

#include <linux/types.h>

/* Key generations a CID's cr bits name (3 = unroutable, never in the map). */
#define STEER_GENERATIONS 3
/* Entries of the cpu_shard map; CPUs at or above it use cpu % shard_count. */
#define STEER_CPU_SLOTS 256
/* Segments the gso-walk variant checks in one skb: UDP_MAX_SEGMENTS of the
 * kernel's UDP GSO (GRO stops at 64). A train with more goes to a shard. */
#define STEER_MAX_TRAIN_SEGMENTS 128

/* steer_gen.active: how the program reads a generation's CIDs. */
/* Not decodable here: rotated away, or an hmac-sha256 ADR 0001 generation. */
#define STEER_GEN_INACTIVE 0
/* A live siphash-2-4 ADR 0001 generation (ADR 0004): k0, k1. */
#define STEER_GEN_SIPHASH 1
/* A live plaintext QUIC-LB generation (docs/adr/0007-quic-lb.md): the server id
 * is in clear after the first octet; quic_lb_config_id, quic_lb_server_id_len. */
#define STEER_GEN_QUIC_LB_PLAINTEXT 2
/* A live encrypted QUIC-LB generation: the program runs no AES, so its CIDs go
 * to a shard, counted as quic_lb_encrypted (ADR 0007). */
#define STEER_GEN_QUIC_LB_ENCRYPTED 3

/* gens[cr]: a key generation the program can decode. */
struct steer_gen {
	/* STEER_GEN_*. */
	__u32 active;
	/* QUIC-LB generations: the config id a DCID's first octet must carry in its
	 * top three bits (another one is not this generation's: no server id), and
	 * the server-id length, 2..=7 bytes: the id is the last two of them, the
	 * others zero (a nonzero one is no server id). 0 otherwise. */
	__u8 quic_lb_config_id;
	__u8 quic_lb_server_id_len;
	__u16 pad;
	/* Its SipHash-2-4 key (ADR 0004 Decision 2). */
	__u64 k0;
	__u64 k1;
};

/* config[0]: fixed for the program's lifetime. */
struct steer_config {
	/* Shard sockets at socks[0 .. shard_count - 1]. */
	__u32 shard_count;
	/* 1: the shard is cpu_shard[cpu] (--steer cpu); 0: the 4-tuple hash. */
	__u32 by_cpu;
	/* The size-limit variant sends every skb whose UDP payload is longer than
	 * this to a shard: the largest UDP payload a worker accepts (quinn's
	 * max_udp_payload_size, proto::header::MAX_UDP_PAYLOAD). */
	__u32 max_udp_payload;
	/* The kernel's SKB_GSO_FRAGLIST bit (read from the kernel's BTF by the
	 * loader; 0 when this kernel has none): the gso-walk variant sends
	 * fraglist GRO skbs to a shard. */
	__u32 gso_fraglist;
};

/*
 * counters[0], one per CPU, summed by the loader. Every skb the program runs on
 * counts once among fast, long_header, short_packet, cr_unroutable,
 * unknown_generation, quic_lb_encrypted, not_live, train_to_shard and
 * select_failed (the outcome,
 * decided by its first datagram and then by the train rule). The others count
 * within those.
 */
struct steer_counters {
	/* Handed to the owning worker's socket. */
	__u64 fast;
	/* Datagrams in the fast skbs (a train counts its segments). */
	__u64 fast_datagrams;
	/* Fast skbs that are trains (more than one datagram). */
	__u64 train_fast;
	/* To a shard: the first datagram is a long header. */
	__u64 long_header;
	/* To a shard: the first datagram is not a routable short header (empty,
	 * fixed bit clear, or shorter than 1 + 12 + 20 bytes). */
	__u64 short_packet;
	/* To a shard: cr = 3. */
	__u64 cr_unroutable;
	/* To a shard: cr names an inactive generation. */
	__u64 unknown_generation;
	/* To a shard: the decoded server id has no live worker socket (for a
	 * plaintext QUIC-LB generation also: another config id, or a server id
	 * wider than 16 bits). */
	__u64 not_live;
	/* To a shard: the first datagram is fast, but the skb is a train the
	 * program cannot prove to be one worker's (gso-walk: a segment that is not
	 * a routable short header of the same server id, a fraglist skb, more than
	 * STEER_MAX_TRAIN_SEGMENTS segments; size-limit: a UDP payload longer
	 * than max_udp_payload). */
	__u64 train_to_shard;
	/* To a shard: the worker's socket could not be selected (closed). */
	__u64 select_failed;
	/* Of the skbs to a shard: not even the shard socket could be selected;
	 * dropped. */
	__u64 shard_select_failed;
	/* To a shard: cr names a live encrypted QUIC-LB generation (ADR 0007). */
	__u64 quic_lb_encrypted;
};

#endif /* QUICDEMUX_STEER_H */
