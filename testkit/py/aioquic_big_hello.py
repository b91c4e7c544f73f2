#!/usr/bin/env python3
"""aioquic HTTP/3 GET whose ClientHello does not fit one Initial packet.

Usage: aioquic_big_hello.py HOST PORT PATH [KEY_SHARE_BYTES]

The ClientHello carries, before aioquic's own key shares, a GREASE key share
(RFC 8701, group 0x0a0a, also listed in supported_groups) of KEY_SHARE_BYTES
(default 1216: the size of an X25519MLKEM768 share, what post-quantum clients send).
A server ignores a GREASE group and picks one of aioquic's real shares, so the
handshake is an ordinary one; only the ClientHello grows past one datagram.

Prints one line
`status=<code> bytes=<n> ok=<pattern ok> ch_packets=<n> ch_bytes=<n> initials_after=<n>`
and exits 0 when the response is complete (status 200, body length ==
content-length, byte i == i % 256). Of the Initial packets the client sent before it
first heard from the server, `ch_packets` counts the distinct CRYPTO offsets (a
retransmission repeats one) and `ch_bytes` is where their CRYPTO data ends: the
ClientHello. `initials_after` counts the client's Initial packets sent after it
first heard from the server (its ACKs and anything else, with the server's CID as
DCID). From aioquic's own packet log (qlog events).
"""
import asyncio
import os
import sys

import aioquic.tls as tls
from aioquic.quic.logger import QuicLogger

from h3get import client_config, get

GREASE_GROUP = 0x0A0A
SHARE_BYTES = int(sys.argv[4]) if len(sys.argv) > 4 else 1216

_push_client_hello = tls.push_client_hello


def push_big_client_hello(buf, hello):
    hello.key_share = [(GREASE_GROUP, os.urandom(SHARE_BYTES))] + list(hello.key_share)
    hello.supported_groups = [GREASE_GROUP] + list(hello.supported_groups)
    _push_client_hello(buf, hello)


tls.push_client_hello = push_big_client_hello


def first_flight(logger):
    """(distinct CRYPTO offsets in Initials before the first packet received, where
    their CRYPTO data ends, Initial packets sent after it)."""
    offsets, end, after, heard = set(), 0, 0, False
    for trace in logger.to_dict()["traces"]:
        for ev in trace["events"]:
            name, data = ev["name"], ev["data"]
            if name.endswith("packet_received"):
                heard = True
            if not name.endswith("packet_sent") or data["header"]["packet_type"] != "initial":
                continue
            if heard:
                after += 1
                continue
            for f in data.get("frames", []):
                if f.get("frame_type") == "crypto":
                    offsets.add(f.get("offset", 0))
                    end = max(end, f.get("offset", 0) + f.get("length", 0))
    return len(offsets), end, after


async def main(host, port, path):
    logger = QuicLogger()
    client = await get(host, port, path, client_config(quic_logger=logger))
    packets, crypto, after = first_flight(logger)
    print(
        f"status={client.status()} bytes={client.size} ok={client.pattern_ok} ch_packets={packets} "
        f"ch_bytes={crypto} initials_after={after}"
    )
    return client.complete()


if __name__ == "__main__":
    sys.exit(0 if asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3])) else 1)
