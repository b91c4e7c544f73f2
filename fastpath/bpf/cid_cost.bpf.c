// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * What decoding a CID costs inside an eBPF program (docs/adr/0007-quic-lb.md): XDP
 * programs run by BPF_PROG_TEST_RUN (fastpath/benches/cid_cost.rs times them,
 * fastpath/tests/cid_cost.rs checks their outputs). Not attached anywhere.
 *
 *   baseline     copies 16 bytes of the packet through the stack and back: the
 *                harness's own cost, subtracted from the others.
 *   siphash      ADR 0004's decode: cid_server_id() of the packet's first 12 bytes
 *                under the key in cost_siphash, the id written at bytes 12..=13.
 *   aes1, aes3   one AES-128 block encryption of bytes 0..=15 (FIPS-197), and three
 *                chained ones: the AES work of QUIC-LB's 3-pass Feistel decode of a
 *                12-byte CID (draft-21 §5.5.2: three dependent encryptions of
 *                expand(half); the expand and XOR steps are not included). Round keys
 *                come expanded from user space (cost_aes_key); byte-oriented rounds,
 *                S-box in .rodata: eBPF has no AES instructions.
 */
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "siphash.h"

#define AES_ROUND_KEYS_LEN 176

struct cost_aes_round_keys {
	__u8 rk[AES_ROUND_KEYS_LEN];
};

struct cost_siphash_key {
	__u64 k0;
	__u64 k1;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cost_aes_round_keys);
} cost_aes_key SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cost_siphash_key);
} cost_siphash SEC(".maps");

static const volatile __u8 sbox[256] = {
	0x63, 0x7c, 0x77, 0x7b, 0xf2, 0x6b, 0x6f, 0xc5, 0x30, 0x01, 0x67, 0x2b, 0xfe, 0xd7, 0xab, 0x76,
	0xca, 0x82, 0xc9, 0x7d, 0xfa, 0x59, 0x47, 0xf0, 0xad, 0xd4, 0xa2, 0xaf, 0x9c, 0xa4, 0x72, 0xc0,
	0xb7, 0xfd, 0x93, 0x26, 0x36, 0x3f, 0xf7, 0xcc, 0x34, 0xa5, 0xe5, 0xf1, 0x71, 0xd8, 0x31, 0x15,
	0x04, 0xc7, 0x23, 0xc3, 0x18, 0x96, 0x05, 0x9a, 0x07, 0x12, 0x80, 0xe2, 0xeb, 0x27, 0xb2, 0x75,
	0x09, 0x83, 0x2c, 0x1a, 0x1b, 0x6e, 0x5a, 0xa0, 0x52, 0x3b, 0xd6, 0xb3, 0x29, 0xe3, 0x2f, 0x84,
	0x53, 0xd1, 0x00, 0xed, 0x20, 0xfc, 0xb1, 0x5b, 0x6a, 0xcb, 0xbe, 0x39, 0x4a, 0x4c, 0x58, 0xcf,
	0xd0, 0xef, 0xaa, 0xfb, 0x43, 0x4d, 0x33, 0x85, 0x45, 0xf9, 0x02, 0x7f, 0x50, 0x3c, 0x9f, 0xa8,
	0x51, 0xa3, 0x40, 0x8f, 0x92, 0x9d, 0x38, 0xf5, 0xbc, 0xb6, 0xda, 0x21, 0x10, 0xff, 0xf3, 0xd2,
	0xcd, 0x0c, 0x13, 0xec, 0x5f, 0x97, 0x44, 0x17, 0xc4, 0xa7, 0x7e, 0x3d, 0x64, 0x5d, 0x19, 0x73,
	0x60, 0x81, 0x4f, 0xdc, 0x22, 0x2a, 0x90, 0x88, 0x46, 0xee, 0xb8, 0x14, 0xde, 0x5e, 0x0b, 0xdb,
	0xe0, 0x32, 0x3a, 0x0a, 0x49, 0x06, 0x24, 0x5c, 0xc2, 0xd3, 0xac, 0x62, 0x91, 0x95, 0xe4, 0x79,
	0xe7, 0xc8, 0x37, 0x6d, 0x8d, 0xd5, 0x4e, 0xa9, 0x6c, 0x56, 0xf4, 0xea, 0x65, 0x7a, 0xae, 0x08,
	0xba, 0x78, 0x25, 0x2e, 0x1c, 0xa6, 0xb4, 0xc6, 0xe8, 0xdd, 0x74, 0x1f, 0x4b, 0xbd, 0x8b, 0x8a,
	0x70, 0x3e, 0xb5, 0x66, 0x48, 0x03, 0xf6, 0x0e, 0x61, 0x35, 0x57, 0xb9, 0x86, 0xc1, 0x1d, 0x9e,
	0xe1, 0xf8, 0x98, 0x11, 0x69, 0xd9, 0x8e, 0x94, 0x9b, 0x1e, 0x87, 0xe9, 0xce, 0x55, 0x28, 0xdf,
	0x8c, 0xa1, 0x89, 0x0d, 0xbf, 0xe6, 0x42, 0x68, 0x41, 0x99, 0x2d, 0x0f, 0xb0, 0x54, 0xbb, 0x16,
};

static __always_inline __u8 xtime(__u8 x)
{
	return (__u8)((x << 1) ^ ((x >> 7) * 0x1b));
}

/* FIPS-197 AES-128 encryption of the 16-byte state s (column-major), in place. */
static __always_inline void aes128_encrypt(const __u8 *rk, __u8 *s)
{
	__u8 t[16];
	int r, i, c;

#pragma unroll
	for (i = 0; i < 16; i++)
		s[i] ^= rk[i];
#pragma unroll
	for (r = 1; r <= 10; r++) {
		/* SubBytes and ShiftRows: row i & 3 moves left by its index. */
#pragma unroll
		for (i = 0; i < 16; i++)
			t[i] = sbox[s[((((i >> 2) + (i & 3)) & 3) << 2) | (i & 3)]];
		if (r < 10) {
#pragma unroll
			for (c = 0; c < 16; c += 4) {
				__u8 a0 = t[c], a1 = t[c + 1], a2 = t[c + 2], a3 = t[c + 3];
				__u8 all = a0 ^ a1 ^ a2 ^ a3;

				s[c] = a0 ^ all ^ xtime(a0 ^ a1);
				s[c + 1] = a1 ^ all ^ xtime(a1 ^ a2);
				s[c + 2] = a2 ^ all ^ xtime(a2 ^ a3);
				s[c + 3] = a3 ^ all ^ xtime(a3 ^ a0);
			}
		} else {
#pragma unroll
			for (i = 0; i < 16; i++)
				s[i] = t[i];
		}
#pragma unroll
		for (i = 0; i < 16; i++)
			s[i] ^= rk[16 * r + i];
	}
}

/* The packet's first 16 bytes, or NULL when it is shorter. */
static __always_inline __u8 *block(struct xdp_md *ctx)
{
	__u8 *p = (__u8 *)(long)ctx->data;

	if (p + 16 > (__u8 *)(long)ctx->data_end)
		return 0;
	return p;
}

SEC("xdp")
int baseline(struct xdp_md *ctx)
{
	__u8 *p = block(ctx), s[16];

	if (!p)
		return XDP_ABORTED;
	__builtin_memcpy(s, p, 16);
	__builtin_memcpy(p, s, 16);
	return XDP_PASS;
}

SEC("xdp")
int siphash(struct xdp_md *ctx)
{
	__u32 zero = 0, id;
	struct cost_siphash_key *k = bpf_map_lookup_elem(&cost_siphash, &zero);
	__u8 *p = block(ctx), s[16];

	if (!p || !k)
		return XDP_ABORTED;
	__builtin_memcpy(s, p, 16);
	id = cid_server_id(k->k0, k->k1, s);
	s[12] = (__u8)(id >> 8);
	s[13] = (__u8)id;
	__builtin_memcpy(p, s, 16);
	return XDP_PASS;
}

SEC("xdp")
int aes1(struct xdp_md *ctx)
{
	__u32 zero = 0;
	struct cost_aes_round_keys *k = bpf_map_lookup_elem(&cost_aes_key, &zero);
	__u8 *p = block(ctx), s[16];

	if (!p || !k)
		return XDP_ABORTED;
	__builtin_memcpy(s, p, 16);
	aes128_encrypt(k->rk, s);
	__builtin_memcpy(p, s, 16);
	return XDP_PASS;
}

SEC("xdp")
int aes3(struct xdp_md *ctx)
{
	__u32 zero = 0;
	struct cost_aes_round_keys *k = bpf_map_lookup_elem(&cost_aes_key, &zero);
	__u8 *p = block(ctx), s[16];

	if (!p || !k)
		return XDP_ABORTED;
	__builtin_memcpy(s, p, 16);
	aes128_encrypt(k->rk, s);
	aes128_encrypt(k->rk, s);
	aes128_encrypt(k->rk, s);
	__builtin_memcpy(p, s, 16);
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
