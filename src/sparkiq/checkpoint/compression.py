"""The stream framings of Spark's ``CompressionCodec`` s, read back into the bytes Spark wrote.

Spark compresses every HDFS-provider state file (``N.delta``, ``N.snapshot``) and the RocksDB
provider's changelog files with the codec named by
``spark.sql.streaming.stateStore.compression.codec`` (recorded in each batch's offset log),
through a Java output stream that adds its own framing around the codec's blocks. The codecs
themselves come from libraries (``cramjam`` for LZ4 blocks, Snappy and Zstandard,
``python-lzf`` for LZF); this module reads only the framings, each documented next to its reader:

=======  ==========================================  ============================================
codec    Java stream                                 integrity
=======  ==========================================  ============================================
lz4      lz4-java ``LZ4BlockOutputStream``           XXH32 of every block (seed 0x9747B28C,
                                                     lz4-java keeps its low 28 bits)
snappy   snappy-java ``SnappyOutputStream``          none beyond the codec's own validity
zstd     zstd-jni ``ZstdOutputStream``               zstd frames (content checksum when set)
lzf      compress-lzf ``LZFOutputStream``            none beyond the codec's own validity
=======  ==========================================  ============================================

Every reader rejects a stream that ends mid-block, a block whose lengths or checksum do not
fit, and trailing garbage, with :class:`CompressionError`: callers turn that into a
:class:`~sparkiq.errors.CorruptSegmentError` naming the file. Nothing here is ever guessed:
an unknown codec name is refused by :func:`codec_for`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import cramjam
import lzf
import xxhash

from sparkiq.errors import ChangelogError

__all__ = ["CODECS", "CompressionError", "codec_for", "decompress"]


class CompressionError(ChangelogError, ValueError):
    """A compressed stream is truncated, corrupted or not in the expected framing."""


# --- lz4: lz4-java's block stream ----------------------------------------------------------
# Each block: the magic "LZ4Block" (8 bytes), a token byte (high nibble: 0x10 raw, 0x20 LZ4;
# low nibble: log2(block size) - 10), the compressed and the original length and the checksum
# (three little-endian int32), then the block's bytes. close() writes an empty raw block with
# checksum 0 that ends the stream; Spark reads concatenated streams, so another may follow.
_LZ4_MAGIC = b"LZ4Block"
_LZ4_HEADER = struct.Struct("<8sBiii")
_LZ4_RAW = 0x10
_LZ4_COMPRESSED = 0x20
_LZ4_SEED = 0x9747B28C
# StreamingXXHash32.asChecksum() masks the hash to 28 bits; lz4-java writes that value.
_LZ4_CHECK_MASK = 0x0FFFFFFF


def _lz4(data: bytes) -> bytes:
    out: list[bytes] = []
    pos, end, ended = 0, len(data), False
    while pos < end:
        if end - pos < _LZ4_HEADER.size:
            raise CompressionError(f"lz4 block header cut short at byte {pos}")
        magic, token, clen, olen, check = _LZ4_HEADER.unpack_from(data, pos)
        if magic != _LZ4_MAGIC:
            raise CompressionError(f"no lz4-java block magic at byte {pos}")
        method, level = token & 0xF0, (token & 0x0F) + 10
        if clen < 0 or olen < 0 or olen > 1 << level or (method == _LZ4_RAW and clen != olen):
            raise CompressionError(f"lz4 block at byte {pos} has impossible lengths")
        pos += _LZ4_HEADER.size
        if olen == 0:
            if clen != 0 or check != 0:
                raise CompressionError(f"lz4 end block at byte {pos} is malformed")
            ended = True
            continue
        ended = False
        if end - pos < clen:
            raise CompressionError(f"lz4 block at byte {pos} cut short")
        block = data[pos : pos + clen]
        pos += clen
        if method == _LZ4_RAW:
            raw = block
        elif method == _LZ4_COMPRESSED:
            try:
                raw = bytes(cramjam.lz4.decompress_block(block, output_len=olen))
            except cramjam.DecompressionError as exc:
                raise CompressionError(f"lz4 block before byte {pos}: {exc}") from None
            if len(raw) != olen:
                raise CompressionError(f"lz4 block before byte {pos} has the wrong length")
        else:
            raise CompressionError(f"lz4 block at byte {pos} has unknown method {method:#x}")
        if xxhash.xxh32_intdigest(raw, seed=_LZ4_SEED) & _LZ4_CHECK_MASK != check:
            raise CompressionError(f"lz4 block before byte {pos} fails its checksum")
        out.append(raw)
    if not ended:
        raise CompressionError("lz4 stream has no end block (the file is truncated)")
    return b"".join(out)


# --- snappy: snappy-java's stream ----------------------------------------------------------
# A header: the magic 0x82 "SNAPPY" 0x00, then the format version and the oldest compatible
# version (big-endian int32, both 1); then chunks: a big-endian int32 length and that many
# bytes of raw Snappy. A header may recur where streams were concatenated.
_SNAPPY_MAGIC = b"\x82SNAPPY\x00"
_SNAPPY_HEADER = 16
_BE_INT = struct.Struct(">i")


def _snappy(data: bytes) -> bytes:
    if not data.startswith(_SNAPPY_MAGIC):
        raise CompressionError("no snappy-java stream header")
    out: list[bytes] = []
    pos, end = 0, len(data)
    while pos < end:
        if data.startswith(_SNAPPY_MAGIC, pos):
            if end - pos < _SNAPPY_HEADER:
                raise CompressionError(f"snappy stream header cut short at byte {pos}")
            pos += _SNAPPY_HEADER
            continue
        if end - pos < 4:
            raise CompressionError(f"snappy chunk length cut short at byte {pos}")
        (size,) = _BE_INT.unpack_from(data, pos)
        pos += 4
        if size < 0 or end - pos < size:
            raise CompressionError(f"snappy chunk at byte {pos} cut short")
        try:
            out.append(bytes(cramjam.snappy.decompress_raw(data[pos : pos + size])))
        except cramjam.DecompressionError as exc:
            raise CompressionError(f"snappy chunk at byte {pos}: {exc}") from None
        pos += size
    return b"".join(out)


# --- zstd: plain Zstandard frames, possibly several ----------------------------------------


def _zstd(data: bytes) -> bytes:
    try:
        return bytes(cramjam.zstd.decompress(data))
    except cramjam.DecompressionError as exc:
        raise CompressionError(f"zstd stream: {exc}") from None


# --- lzf: compress-lzf's chunk stream ------------------------------------------------------
# Chunks: "ZV", a type byte (0 stored, 1 compressed), a big-endian uint16 length, and for a
# compressed chunk also the uint16 original length; then the chunk's bytes.
_LZF_STORED = struct.Struct(">2sBH")
_LZF_COMPRESSED = struct.Struct(">2sBHH")


def _lzf(data: bytes) -> bytes:
    out: list[bytes] = []
    pos, end = 0, len(data)
    while pos < end:
        if end - pos < _LZF_STORED.size:
            raise CompressionError(f"lzf chunk header cut short at byte {pos}")
        magic, kind, size = _LZF_STORED.unpack_from(data, pos)
        if magic != b"ZV" or kind not in (0, 1):
            raise CompressionError(f"no lzf chunk header at byte {pos}")
        if kind == 0:
            pos += _LZF_STORED.size
            if end - pos < size:
                raise CompressionError(f"lzf chunk at byte {pos} cut short")
            out.append(data[pos : pos + size])
            pos += size
            continue
        if end - pos < _LZF_COMPRESSED.size:
            raise CompressionError(f"lzf chunk header cut short at byte {pos}")
        _, _, size, original = _LZF_COMPRESSED.unpack_from(data, pos)
        pos += _LZF_COMPRESSED.size
        if end - pos < size:
            raise CompressionError(f"lzf chunk at byte {pos} cut short")
        raw = lzf.decompress(data[pos : pos + size], original)
        if raw is None or len(raw) != original:
            raise CompressionError(f"lzf chunk at byte {pos} does not decompress")
        out.append(raw)
        pos += size
    return b"".join(out)


#: Spark's short codec names (``CompressionCodec.shortCompressionCodecNames``) and readers.
CODECS: dict[str, Callable[[bytes], bytes]] = {
    "lz4": _lz4,
    "lzf": _lzf,
    "snappy": _snappy,
    "zstd": _zstd,
}
_CLASS_NAMES = {
    "org.apache.spark.io.LZ4CompressionCodec": "lz4",
    "org.apache.spark.io.LZFCompressionCodec": "lzf",
    "org.apache.spark.io.SnappyCompressionCodec": "snappy",
    "org.apache.spark.io.ZStdCompressionCodec": "zstd",
}


def codec_for(name: str) -> str:
    """The short name of Spark's codec ``name`` (a short name in any case, or the codec's
    class name, as Spark accepts both). Raises :class:`CompressionError` naming the codecs
    sparkiq reads when ``name`` is none of them."""
    short = _CLASS_NAMES.get(name, name.lower())
    if short not in CODECS:
        raise CompressionError(
            f"unknown state store compression codec {name!r}; sparkiq reads "
            f"{', '.join(sorted(CODECS))} (spark.sql.streaming.stateStore.compression.codec)"
        )
    return short


def decompress(codec: str, data: bytes) -> bytes:
    """The bytes Spark wrote through codec ``codec`` (a name :func:`codec_for` accepts)."""
    return CODECS[codec_for(codec)](data)
