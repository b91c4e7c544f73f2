#!/usr/bin/env python3
"""Minimal aioquic HTTP/3 GET client for the worker interop test.

Usage: aioquic_h3_get.py HOST PORT PATH [--v2-first]
Prints one line `status=<code> bytes=<n> server_id=<id> ok=<pattern ok> version=<v>`
and exits 0 when the response is complete (status 200, body length ==
content-length). `--v2-first` offers QUIC v2 (RFC 9369) first, then v1: the first
Initial is a v2 one, and a Version Negotiation moves the client to v1 (RFC 9368).
The body of /bytes/N is checked against the server's pattern (byte i == i % 256);
other paths report ok=False (no pattern to check).
"""
import asyncio
import ssl
import sys

from aioquic.asyncio import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.packet import QuicProtocolVersion


class H3Client(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic)
        self.done = asyncio.get_event_loop().create_future()
        self.headers = {}
        self.size = 0
        self.pattern_ok = True

    def get(self, authority, path):
        self.pattern_ok = path.startswith("/bytes/")
        sid = self._quic.get_next_available_stream_id()
        self.h3.send_headers(
            stream_id=sid,
            headers=[
                (b":method", b"GET"),
                (b":scheme", b"https"),
                (b":authority", authority.encode()),
                (b":path", path.encode()),
            ],
            end_stream=True,
        )
        self.transmit()

    def quic_event_received(self, event):
        for ev in self.h3.handle_event(event):
            if isinstance(ev, HeadersReceived):
                self.headers.update({k.decode(): v.decode() for k, v in ev.headers})
            elif isinstance(ev, DataReceived):
                data = ev.data
                off = self.size
                if self.pattern_ok:
                    for i, b in enumerate(data):
                        if b != (off + i) % 256:
                            self.pattern_ok = False
                            break
                self.size += len(data)
            if getattr(ev, "stream_ended", False) and not self.done.done():
                self.done.set_result(True)


async def main(host, port, path, v2_first):
    cfg = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, server_name="localhost")
    cfg.verify_mode = ssl.CERT_NONE
    if v2_first:
        cfg.supported_versions = [QuicProtocolVersion.VERSION_2, QuicProtocolVersion.VERSION_1]
    async with connect(host, port, configuration=cfg, create_protocol=H3Client) as client:
        client.get(f"localhost:{port}", path)
        await asyncio.wait_for(client.done, timeout=60)
        status = client.headers.get(":status")
        length = int(client.headers.get("content-length", "-1"))
        print(
            f"status={status} bytes={client.size} server_id={client.headers.get('x-server-id')} "
            f"ok={client.pattern_ok} version={client._quic._version:#x}"
        )
        return status == "200" and client.size == length and client.pattern_ok


if __name__ == "__main__":
    ok = asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3], "--v2-first" in sys.argv[4:]))
    sys.exit(0 if ok else 1)
