/* SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause */
/*
 * SipHash-2-4 of a 9-byte message (the CID prefix of ADR 0004 Decision 3), exactly as
 * the SipHash paper's reference implementation defines it. Plain C on __u64: the eBPF
 * program (bpf/steer.bpf.c) and an ordinary host build (tests/siphash_host.rs compiles
 * it with the system C compiler and checks it against ADR 0004's known answer and
 * proto) use this one text.
 */
#ifndef QUICDEMUX_SIPHASH_H
#define QUICDEMUX_SIPHASH_H

#include <linux/types.h>

#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif

#define QD_ROTL(x, b) (((x) << (b)) | ((x) >> (64 - (b))))
#define QD_SIPROUND                                                              \
	do {                                                                     \
		v0 += v1; v1 = QD_ROTL(v1, 13); v1 ^= v0; v0 = QD_ROTL(v0, 32); \
		v2 += v3; v3 = QD_ROTL(v3, 16); v3 ^= v2;                        \
		v0 += v3; v3 = QD_ROTL(v3, 21); v3 ^= v0;                        \
		v2 += v1; v1 = QD_ROTL(v1, 17); v1 ^= v2; v2 = QD_ROTL(v2, 32); \
	} while (0)

/* One 8-byte block (m[0..8], little-endian), then the final block holding m[8] and
 * the message length (9 << 56); two compression rounds, four finalization rounds. */
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
	QD_SIPROUND;
	QD_SIPROUND;
	v0 ^= b0;
	v3 ^= b1;
	QD_SIPROUND;
	QD_SIPROUND;
	v0 ^= b1;
	v2 ^= 0xff;
	QD_SIPROUND;
	QD_SIPROUND;
	QD_SIPROUND;
	QD_SIPROUND;
	return v0 ^ v1 ^ v2 ^ v3;
}

/* The server id carried in a 12-byte CID under the generation key (k0, k1) (ADR 0004
 * Decision 3): mask = the low two bytes of h, id = (cid[9] ^ mask[0]) << 8 |
 * (cid[10] ^ mask[1]). */
static __always_inline __u32 cid_server_id(__u64 k0, __u64 k1, const __u8 *cid)
{
	__u64 h = siphash24_9(k0, k1, cid);

	return ((__u32)(cid[9] ^ (__u8)(h & 0xff)) << 8) | (__u32)(cid[10] ^ (__u8)((h >> 8) & 0xff));
}

#endif /* QUICDEMUX_SIPHASH_H */
