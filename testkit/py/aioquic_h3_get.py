#!/usr/bin/env python3
"""Minimal aioquic HTTP/3 GET client for the interop tests (h3get.py).

Usage: aioquic_h3_get.py HOST PORT PATH [--v2-first]
Prints one line `status=<code> bytes=<n> server_id=<id> ok=<pattern ok> version=<v>`
and exits 0 when the response is complete (status 200, body length ==
content-length). `--v2-first` offers QUIC v2 (RFC 9369) first, then v1: the first
Initial is a v2 one, and a Version Negotiation moves the client to v1 (RFC 9368).
The body of /bytes/N is checked against the server's pattern (byte i == i % 256);
other paths report ok=False (no pattern to check).
"""
import asyncio
import sys

from aioquic.quic.packet import QuicProtocolVersion

from h3get import client_config, get


async def main(host, port, path, v2_first):
    cfg = client_config()
    if v2_first:
        cfg.supported_versions = [QuicProtocolVersion.VERSION_2, QuicProtocolVersion.VERSION_1]
    client = await get(host, port, path, cfg)
    print(
        f"status={client.status()} bytes={client.size} server_id={client.headers.get('x-server-id')} "
        f"ok={client.pattern_ok} version={client._quic._version:#x}"
    )
    return client.complete()


if __name__ == "__main__":
    ok = asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3], "--v2-first" in sys.argv[4:]))
    sys.exit(0 if ok else 1)
