"""The channel's file format, shared with the C++ library (worker/shared_dir_channel.cc):
a 64-byte little-endian header, the shape as int64s, zero padding to a multiple of 64 bytes,
then the payload. The header's checksum covers the header region with that field zero; the
payload's checksum is XXH3-64 and is repeated in the store announcement."""

import struct

import torch

from . import checksum

MAGIC = b"MUSTRCH1"
VERSION = 2
MAX_DIMS = 64
KIND_TENSOR = 1
KIND_BYTES = 2

# magic, version, kind, transfer id, payload bytes, checksum, dtype, ndim, src rank,
# header bytes, header checksum
_HEADER = struct.Struct("<8sIIQQQiIiIQ")
HEADER_SIZE = _HEADER.size
_HEADER_CHECKSUM_AT = 56
assert HEADER_SIZE == 64

# c10::ScalarType's numbers (the order PyTorch keeps for its serialization format). The dtypes
# a torch install lacks are left out; the C++ library refuses codes its LibTorch does not know.
_CODES = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16",
          6: "float32", 7: "float64", 8: "complex32", 9: "complex64", 10: "complex128",
          11: "bool", 15: "bfloat16", 23: "float8_e5m2", 24: "float8_e4m3fn",
          25: "float8_e5m2fnuz", 26: "float8_e4m3fnuz", 27: "uint16", 28: "uint32",
          29: "uint64"}
DTYPE_OF_CODE = {c: getattr(torch, n) for c, n in _CODES.items() if hasattr(torch, n)}
CODE_OF_DTYPE = {d: c for c, d in DTYPE_OF_CODE.items()}


def header_bytes(ndim):
    return (HEADER_SIZE + 8 * ndim + 63) // 64 * 64


def pack_header(kind, transfer_id, payload_bytes, payload_checksum, dtype_code, shape, src):
    """The header region (header, shape, padding) with its own checksum filled in."""
    size = header_bytes(len(shape))
    region = bytearray(size)
    _HEADER.pack_into(region, 0, MAGIC, VERSION, kind, transfer_id, payload_bytes,
                      payload_checksum, dtype_code, len(shape), src, size, 0)
    struct.pack_into(f"<{len(shape)}q", region, HEADER_SIZE, *shape)
    struct.pack_into("<Q", region, _HEADER_CHECKSUM_AT, checksum.xxh3_64(region))
    return bytes(region)


class Header:
    __slots__ = ("magic", "version", "kind", "transfer_id", "payload_bytes", "checksum",
                 "dtype_code", "ndim", "src", "header_bytes", "header_checksum")

    def __init__(self, buffer):
        (self.magic, self.version, self.kind, self.transfer_id, self.payload_bytes,
         self.checksum, self.dtype_code, self.ndim, self.src, self.header_bytes,
         self.header_checksum) = _HEADER.unpack_from(buffer, 0)

    def region_checksum(self, buffer):
        """XXH3 of the header region as written (this field zero)."""
        region = bytearray(buffer[:self.header_bytes])
        region[_HEADER_CHECKSUM_AT:_HEADER_CHECKSUM_AT + 8] = b"\0" * 8
        return checksum.xxh3_64(region)

    def shape(self, buffer):
        return list(struct.unpack_from(f"<{self.ndim}q", buffer, HEADER_SIZE))
