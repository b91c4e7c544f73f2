"""The aioquic HTTP/3 GET shared by the aioquic client scripts of the tests
(aioquic_h3_get.py, aioquic_big_hello.py): one request, its headers, its body
length, and whether the body is the server's pattern (byte i == i % 256, checked
for /bytes/N only).
"""
import asyncio
import ssl

from aioquic.asyncio import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration


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

    def status(self):
        return self.headers.get(":status")

    def complete(self):
        """Status 200, body length == content-length, the pattern intact."""
        length = int(self.headers.get("content-length", "-1"))
        return self.status() == "200" and self.size == length and self.pattern_ok


def client_config(**kwargs):
    """A client configuration for HTTP/3 to `localhost`, certificates unchecked."""
    cfg = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, server_name="localhost", **kwargs)
    cfg.verify_mode = ssl.CERT_NONE
    return cfg


async def get(host, port, path, cfg):
    """GETs `path` from host:port (at most 60 s for the response); the finished
    H3Client."""
    async with connect(host, port, configuration=cfg, create_protocol=H3Client) as client:
        client.get(f"localhost:{port}", path)
        await asyncio.wait_for(client.done, timeout=60)
        return client
