/* The program's SipHash (bpf/siphash.h) built as ordinary host C, for
 * tests/siphash_host.rs: reads lines "k0 k1 cid" (two hex u64s, 24 hex digits of a
 * 12-byte CID) and prints "h id": SipHash-2-4 of the CID's first 9 bytes and the
 * server id the program would read from it. */
#include <stdio.h>
#include <inttypes.h>
#include "siphash.h"

int main(void)
{
	unsigned long long k0, k1;
	char hex[25];
	__u8 cid[12];

	while (scanf("%llx %llx %24s", &k0, &k1, hex) == 3) {
		for (int i = 0; i < 12; i++) {
			unsigned int b;

			if (sscanf(hex + 2 * i, "%2x", &b) != 1)
				return 2;
			cid[i] = (__u8)b;
		}
		printf("%016" PRIx64 " %u\n", (uint64_t)siphash24_9(k0, k1, cid), cid_server_id(k0, k1, cid));
	}
	return 0;
}
