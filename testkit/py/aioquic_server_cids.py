#!/usr/bin/env python3
"""aioquic HTTP/3 GET that reports the connection IDs the server chose (for the
QUIC-LB interop test, docs/adr/0007-quic-lb.md).

Usage: aioquic_server_cids.py HOST PORT PATH
Prints one line `status=<code> bytes=<n> server_id=<id> ok=<pattern ok>
cids=<hex>,<hex>,... retry_scid=<hex or ->` where cids are every CID the server gave
this client: the Source Connection ID of its handshake packets (the one the client
talks to first) and those of its NEW_CONNECTION_ID frames (RFC 9000 §5.1.1), as
aioquic holds them; retry_scid is the Source Connection ID of a Retry the client got
(RFC 9000 §17.2.5), `-` without one. Exits 0 when the response is complete.
"""
import asyncio
import sys

from h3get import client_config, get


async def main(host, port, path):
    client = await get(host, port, path, client_config())
    quic = client._quic
    cids = [quic._peer_cid.cid] + [c.cid for c in quic._peer_cid_available]
    retry = quic._retry_source_connection_id
    print(
        f"status={client.status()} bytes={client.size} server_id={client.headers.get('x-server-id')} "
        f"ok={client.pattern_ok} cids={','.join(c.hex() for c in cids)} retry_scid={retry.hex() if retry else '-'}"
    )
    return client.complete()


if __name__ == "__main__":
    ok = asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
    sys.exit(0 if ok else 1)
