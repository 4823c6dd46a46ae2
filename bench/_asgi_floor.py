"""The floor for HTTP lookups: the least an ASGI handler can do to answer a key lookup.

It parses the key from the path, reads one rocksdict database holding the same encoded keys
and rows, and returns the stored bytes -- no validation, routing, decoding or JSON. Served
by uvicorn with the same settings as a node (httptools, uvloop, no access log, no proxy
headers, no ``server`` header). Unlike a node, it writes each answer in uvicorn's two
socket writes (head, then body, see :mod:`sparkiq.server.writes`).

Usage: ``python -m bench._asgi_floor <rocksdb dir> <port>``.
"""

from __future__ import annotations

import sys
from typing import Any

import uvicorn
from rocksdict import AccessType, Options, Rdict

from bench._changelog import SCHEMA_JSON
from sparkiq.schema.codec import KeyCodec
from sparkiq.schema.types import TableSchema


def main() -> None:
    db = Rdict(sys.argv[1], Options(raw_mode=True), access_type=AccessType.read_only())
    keys = KeyCodec(TableSchema.from_spark_json(SCHEMA_JSON, ["k"]))
    headers = [(b"content-type", b"application/octet-stream")]

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        key = scope["path"].rsplit("/", 1)[1]
        value = db.get(keys.encode((key,)))
        status = 200 if value is not None else 404
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": value or b""})

    uvicorn.run(
        app,
        host="127.0.0.1",
        port=int(sys.argv[2]),
        lifespan="off",
        access_log=False,
        log_level="warning",
        http="httptools",
        loop="uvloop",
        proxy_headers=False,
        server_header=False,
    )


if __name__ == "__main__":
    main()
