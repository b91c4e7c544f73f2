#!/usr/bin/env python3
"""An independent QUIC-LB load-balancer decoder (draft-ietf-quic-load-balancers-21).

Written from the draft's text (sections 3, 4.1 and 5.5), not from quicdemux's Rust
code: the Feistel halves are integers of 4 * plaintext_len bits here, not octet
arrays, and AES-128-ECB comes from the `cryptography` package (OpenSSL). It decodes,
it does not encode: the CIDs it reads come from someone else.

Use as a module (`Config`, `LoadBalancer`) or as a process speaking lines on
stdin/stdout, one answer line per request line, flushed:

    config ID SID_LEN NONCE_LEN KEY_HEX|-   ->  ok | error TEXT
    decode CID_HEX                          ->  sid ID SID_HEX | unroutable REASON
    (anything else)                         ->  error TEXT

REASON is one of: empty, marked (config id 0b111), unknown-config, too-short.

`--self-test` checks the draft's Appendix B vectors and its worked example
(section 5.4.2.4), and exits non-zero on any mismatch.
"""

import sys

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

UNROUTABLE_CONFIG_ID = 0b111
MAX_CID_LEN = 20


class Config:
    """One QUIC-LB config as a load balancer holds it (section 5.3)."""

    def __init__(self, config_id, sid_len, nonce_len, key=None):
        if not 0 <= config_id < UNROUTABLE_CONFIG_ID:
            raise ValueError("config id %d is not 0..6" % config_id)
        if sid_len < 1 or nonce_len < 4 or sid_len + nonce_len > 19:
            raise ValueError("lengths %d + %d break section 5.3" % (sid_len, nonce_len))
        if key is not None and len(key) != 16:
            raise ValueError("a key is 16 octets")
        self.config_id = config_id
        self.sid_len = sid_len
        self.nonce_len = nonce_len
        self.plaintext_len = sid_len + nonce_len
        self.key = key
        if key is not None:
            self._cipher = Cipher(algorithms.AES(key), modes.ECB())

    def _aes_encrypt(self, block):
        enc = self._cipher.encryptor()
        return enc.update(block) + enc.finalize()

    def _aes_decrypt(self, block):
        dec = self._cipher.decryptor()
        return dec.update(block) + dec.finalize()

    def server_id(self, cid):
        """The server id (bytes) of a CID of this config, or None if it is too short."""
        n = self.plaintext_len
        if len(cid) < 1 + n:
            return None
        block = cid[1 : 1 + n]
        if self.key is None:
            return block[: self.sid_len]
        if n == 16:
            # Section 5.5.1: one AES-ECB block.
            return self._aes_decrypt(block)[: self.sid_len]
        return self._feistel_server_id(block)

    def _feistel_server_id(self, block):
        """Section 5.5.2, with halves as integers of 4 * n bits each."""
        n = self.plaintext_len
        half_len = (n + 1) // 2  # octets that expand() takes and truncate() keeps
        half_bits = 4 * n
        half_mask = (1 << half_bits) - 1
        odd = n % 2 == 1
        whole = int.from_bytes(block, "big")
        left = whole >> half_bits  # left_2
        right = whole & half_mask  # right_2

        def left_octets(v):
            # An odd-length left half ends with four clear bits.
            return (v << 4 if odd else v).to_bytes(half_len, "big")

        def right_octets(v):
            # An odd-length right half starts with four clear bits.
            return v.to_bytes(half_len, "big")

        def mask(pass_number, half):
            expanded = half + bytes(14 - half_len) + bytes([n, pass_number])
            assert len(expanded) == 16
            return int.from_bytes(self._aes_encrypt(expanded)[:half_len], "big")

        def xor_left(v, m):
            return (v ^ (m >> 4 if odd else m)) & half_mask

        def xor_right(v, m):
            return (v ^ m) & half_mask

        left = xor_left(left, mask(4, right_octets(right)))  # left_1
        right = xor_right(right, mask(3, left_octets(left)))  # right_1
        left = xor_left(left, mask(2, right_octets(right)))  # left_0
        if self.nonce_len >= self.sid_len:
            # The server id lies in left_0: three passes are enough.
            return left_octets(left)[: self.sid_len]
        right = xor_right(right, mask(1, left_octets(left)))  # right_0
        plaintext = ((left << half_bits) | right).to_bytes(n, "big")
        return plaintext[: self.sid_len]


class LoadBalancer:
    """The configs of up to seven config ids, and the routing decode of section 4.1."""

    def __init__(self):
        self.configs = {}

    def add(self, config):
        self.configs[config.config_id] = config

    def decode(self, cid):
        """('sid', config_id, server_id) or ('unroutable', reason)."""
        if len(cid) == 0:
            return ("unroutable", "empty")
        config_id = cid[0] >> 5
        if config_id == UNROUTABLE_CONFIG_ID:
            return ("unroutable", "marked")
        config = self.configs.get(config_id)
        if config is None:
            return ("unroutable", "unknown-config")
        sid = config.server_id(cid)
        if sid is None:
            return ("unroutable", "too-short")
        return ("sid", config_id, sid)


# Appendix B.2's key; the draft's example of section 5.4.2.4 has its own.
APPENDIX_B_KEY = "8f95f09245765f80256934e50c66207f"
EXAMPLE_KEY = "fdf726a9893ec05c0632d3956680baf0"

# (config id, server id, nonce length, CID, key). Two defects of the draft:
# - Appendix B.1's second vector ("1 350d28b420 3487d970b 20a350d28b4203487d970b")
#   has a nine-hex-digit nonce and a first octet that contradicts its length; it is
#   left out.
# - Appendix B.2's vector labelled "cr_bits 3" has first octet 0x12, config id 0
#   (0b000): it is checked as config 0.
VECTORS = [
    (0, "c4605e", 4, "07c4605e4504cc4f", None),
    (0, "ed793a", 4, "0720b1d07b359d3c", APPENDIX_B_KEY),
    (1, "ed793a51d49b8f5fab65", 5, "2fcc381bc74cb4fbad2823a3d1f8fed2", APPENDIX_B_KEY),
    (2, "ed793a51d49b8f5f", 8, "504dd2d05a7b0de9b2b9907afb5ecf8cc3", APPENDIX_B_KEY),
    (0, "ed793a51d49b8f5fab", 9, "125779c9cc86beb3a3a4a3ca96fce4bfe0cdbc", APPENDIX_B_KEY),
    (0, "31441a", 4, "0767947d29be054a", EXAMPLE_KEY),
]


def self_test():
    failures = 0
    for config_id, sid, nonce_len, cid, key in VECTORS:
        lb = LoadBalancer()
        sid_bytes = bytes.fromhex(sid)
        key_bytes = bytes.fromhex(key) if key else None
        lb.add(Config(config_id, len(sid_bytes), nonce_len, key_bytes))
        got = lb.decode(bytes.fromhex(cid))
        if got != ("sid", config_id, sid_bytes):
            print("FAIL %s: got %r, want server id %s" % (cid, got, sid), file=sys.stderr)
            failures += 1
        # The first octet self-encodes the length in every vector.
        if bytes.fromhex(cid)[0] & 0x1F != len(cid) // 2 - 1:
            print("FAIL %s: self-encoded length" % cid, file=sys.stderr)
            failures += 1
    # Unroutable: 0b111, an unknown config id, too short, empty.
    lb = LoadBalancer()
    lb.add(Config(1, 3, 4))
    checks = [
        (bytes.fromhex("e001020304050607"), ("unroutable", "marked")),
        (bytes.fromhex("0001020304050607"), ("unroutable", "unknown-config")),
        (bytes.fromhex("20010203040506"), ("unroutable", "too-short")),
        (b"", ("unroutable", "empty")),
        (bytes.fromhex("200102030405060708"), ("sid", 1, bytes.fromhex("010203"))),
    ]
    for cid, want in checks:
        if lb.decode(cid) != want:
            print("FAIL %s: got %r, want %r" % (cid.hex(), lb.decode(cid), want), file=sys.stderr)
            failures += 1
    print("quic_lb_ref self-test: %d vectors, %d failures" % (len(VECTORS) + len(checks), failures))
    return failures == 0


def serve(inp, out):
    lb = LoadBalancer()
    for line in inp:
        words = line.split()
        try:
            if len(words) == 5 and words[0] == "config":
                key = None if words[4] == "-" else bytes.fromhex(words[4])
                lb.add(Config(int(words[1]), int(words[2]), int(words[3]), key))
                answer = "ok"
            elif len(words) == 2 and words[0] == "decode":
                got = lb.decode(bytes.fromhex(words[1]))
                if got[0] == "sid":
                    answer = "sid %d %s" % (got[1], got[2].hex())
                else:
                    answer = "unroutable %s" % got[1]
            elif len(words) == 1 and words[0] == "decode":
                answer = "unroutable empty"
            else:
                answer = "error unknown request"
        except ValueError as e:
            answer = "error %s" % e
        out.write(answer + "\n")
        out.flush()


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(0 if self_test() else 1)
    serve(sys.stdin, sys.stdout)
