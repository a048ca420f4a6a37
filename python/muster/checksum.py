"""XXH3-64, the channel's checksum (the C++ library's): Debian's python3-xxhash (``xxhash``),
else libxxhash itself through ctypes (the library the xxhash command and muster's C++ build
use). MUSTER_CHECKSUM_IMPL=xxhash|libxxhash picks one (benchmarks, tests)."""

import ctypes
import ctypes.util
import os

_CHUNK = 8 << 20


def _address(view):
    """The address of a writable contiguous buffer (a mapping, a tensor's memory)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(view)) if len(view) else 0


def _writable(view):
    """A byte view ctypes can take the address of (read-only buffers are copied: the
    fallback's byte payloads), released when the caller's ``with`` ends so that no export
    outlives the call (a mapping with exports cannot be closed)."""
    v = memoryview(view).cast("B")
    if v.readonly:
        v.release()
        v = memoryview(bytearray(view))
    return v


class _Module:
    name = "xxhash (python3-xxhash)"

    def __init__(self):
        import xxhash
        self._xxhash = xxhash

    def digest(self, view):
        return self._xxhash.xxh3_64_intdigest(view)

    def hasher(self):
        return self._xxhash.xxh3_64()


class _LibHasher:
    def __init__(self, lib):
        self._lib = lib
        self._state = lib.XXH3_createState()
        if not self._state:
            raise MemoryError("XXH3_createState")
        lib.XXH3_64bits_reset(self._state)

    def update(self, view):
        with _writable(view) as v:
            self._lib.XXH3_64bits_update(self._state, _address(v), len(v))

    def intdigest(self):
        return self._lib.XXH3_64bits_digest(self._state)

    def __del__(self):
        if getattr(self, "_state", None):
            self._lib.XXH3_freeState(self._state)


class _Library:
    name = "libxxhash (ctypes)"

    def __init__(self):
        path = ctypes.util.find_library("xxhash") or "libxxhash.so.0"
        lib = ctypes.CDLL(path)
        lib.XXH3_64bits.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        lib.XXH3_64bits.restype = ctypes.c_uint64
        lib.XXH3_createState.restype = ctypes.c_void_p
        lib.XXH3_freeState.argtypes = [ctypes.c_void_p]
        lib.XXH3_64bits_reset.argtypes = [ctypes.c_void_p]
        lib.XXH3_64bits_update.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        lib.XXH3_64bits_digest.argtypes = [ctypes.c_void_p]
        lib.XXH3_64bits_digest.restype = ctypes.c_uint64
        self._lib = lib

    def digest(self, view):
        with _writable(view) as v:
            return self._lib.XXH3_64bits(_address(v), len(v))

    def hasher(self):
        return _LibHasher(self._lib)


def _load():
    wanted = os.environ.get("MUSTER_CHECKSUM_IMPL", "")
    errors = []
    for cls in ((_Library,) if wanted == "libxxhash" else
                (_Module,) if wanted == "xxhash" else (_Module, _Library)):
        try:
            return cls()
        except (ImportError, OSError, AttributeError) as e:
            errors.append(f"{cls.name}: {e}")
    raise ImportError("muster's channel needs XXH3: install python3-xxhash (apt) or xxhash "
                      "(pip), or libxxhash0; tried " + "; ".join(errors))


_impl = None


def implementation():
    """The XXH3 in use (loaded on first use)."""
    global _impl
    if _impl is None:
        _impl = _load()
    return _impl


def xxh3_64(view):
    return implementation().digest(view)


def hasher():
    """A streaming XXH3-64: update(buffer), intdigest()."""
    return implementation().hasher()
