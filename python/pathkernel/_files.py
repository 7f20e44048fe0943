"""Files of a run directory: atomic writes, CRC-32, .npy bytes.

The same conventions as the C++ writer (src/core/files.cpp, src/core/npy.cpp):
every file is written to ``FILE.tmp.PID``, flushed, synced and renamed into
place, and listed in manifest.json with its size and CRC-32 (zlib's).
"""
import io
import json
import os
import zlib

import numpy as np


class RunFormatError(ValueError):
    """A run or explain directory that does not read as pathkernel wrote it."""


def crc32(data: bytes) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF


def npy_bytes(array: np.ndarray) -> bytes:
    """The bytes numpy.save writes (format 1.0, C order, little-endian), the
    same bytes as pathkernel's own npy_bytes for float64/float32/int64/int32."""
    a = np.asarray(array)
    if a.dtype.byteorder == ">" or (a.dtype.byteorder == "=" and np.little_endian is False):
        a = a.astype(a.dtype.newbyteorder("<"))
    a = np.ascontiguousarray(a)
    out = io.BytesIO()
    np.save(out, a, allow_pickle=False)
    return out.getvalue()


def write_atomic(path: str, data: bytes, sync: bool = True) -> None:
    """Writes ``data`` to ``path`` atomically: a temporary file in the same
    directory, flushed and (with ``sync``) synced, then renamed. On failure
    the temporary file is removed and ``path`` is unchanged. Without
    ``sync`` the caller makes the file durable (sync_files) before a manifest
    lists it."""
    tmp = "%s.tmp.%d" % (path, os.getpid())
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            if sync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise OSError(e.errno, "cannot write '%s': %s" % (path, e.strerror)) from e


def sync_directory(path: str) -> None:
    """Makes the renames inside directory ``path`` durable."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


_syncfs = None


def sync_files(directory: str, paths) -> None:
    """Makes the files ``paths`` (written with sync=False) and the renames in
    ``directory`` durable: one syncfs(2) of the file system holding the run
    when the C library has it (one journal commit instead of one per file),
    else an fsync of each file."""
    global _syncfs
    if _syncfs is None:
        try:
            import ctypes
            import ctypes.util
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            _syncfs = libc.syncfs
            _syncfs.argtypes = [ctypes.c_int]
        except (OSError, AttributeError):
            _syncfs = False
    if _syncfs:
        fd = os.open(directory, os.O_RDONLY)
        try:
            if _syncfs(fd) == 0:
                return
        finally:
            os.close(fd)
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    for d in {os.path.dirname(p) for p in paths} | {directory}:
        sync_directory(d)


def file_record(relative: str, data: bytes) -> dict:
    return {"file": relative, "bytes": len(data), "crc32": crc32(data)}


def json_text(obj) -> str:
    """manifest.json's text: two-space indentation like the C++ writer; NaN and
    infinities are refused (they are not JSON)."""
    return json.dumps(obj, indent=2, allow_nan=False) + "\n"


def step_name(prefix: str, step: int) -> str:
    return "%s%08d.npy" % (prefix, step)


def read_listed(directory: str, record: dict, what: str) -> bytes:
    """Reads a file listed in a manifest and checks its size and CRC-32."""
    name = record.get("file") if isinstance(record, dict) else None
    if not isinstance(name, str) or not name:
        raise RunFormatError("run '%s': %s has no file name in manifest.json (%r)" % (directory, what, record))
    if os.path.isabs(name) or ".." in name.replace("\\", "/").split("/"):
        raise RunFormatError("run '%s': %s file '%s' in manifest.json must be a path inside the run directory"
                             % (directory, what, name))
    path = os.path.join(directory, name)
    if not os.path.isfile(path):
        raise RunFormatError("run '%s': %s file '%s' listed in manifest.json is missing" % (directory, what, name))
    with open(path, "rb") as f:
        data = f.read()
    if "bytes" in record and len(data) != record["bytes"]:
        raise RunFormatError("run '%s': %s file '%s' has %d bytes, manifest.json says %d"
                             % (directory, what, name, len(data), record["bytes"]))
    if "crc32" in record and crc32(data) != record["crc32"]:
        raise RunFormatError("run '%s': %s file '%s' has CRC-32 %d, manifest.json says %d (the file is corrupt)"
                             % (directory, what, name, crc32(data), record["crc32"]))
    return data


def parse_npy(data: bytes, what: str) -> np.ndarray:
    try:
        return np.load(io.BytesIO(data), allow_pickle=False)
    except Exception as e:  # numpy raises ValueError, OSError, EOFError...
        raise RunFormatError("%s: not a readable .npy file (%s)" % (what, e)) from e


# An input array with at most this many distinct values is stored as uint8
# codes and a table of the values (data/NAME.codes.npy, data/NAME.values.npy).
MAX_CODED_VALUES = 256
_CODE_CHUNK = 1 << 22  # elements per pass of the encoder (bounded memory)
_BITS = {np.dtype(np.float64): np.uint64, np.dtype(np.float32): np.uint32, np.dtype(np.int64): np.uint64,
         np.dtype(np.int32): np.uint32}
_HASH_BITS = 16
_SAMPLE = 1 << 18  # elements whose values start the table


def _hash(bits: np.ndarray, multiplier) -> np.ndarray:
    """Multiplicative hashing of bit patterns to [0, 2^16)."""
    width = bits.dtype.itemsize * 8
    return (bits * multiplier) >> bits.dtype.type(width - _HASH_BITS)


def _perfect_hash(table: np.ndarray):
    """A multiplier under which the table's entries hash apart, and the
    lookup from hash to code; None if none of the tries separates them."""
    rng = np.random.default_rng(0)
    info = np.iinfo(table.dtype)
    for _ in range(64):
        multiplier = table.dtype.type(int(rng.integers(0, info.max, dtype=table.dtype)) | 1)
        h = _hash(table, multiplier)
        if np.unique(h).size == table.size:
            lookup = np.zeros(1 << _HASH_BITS, dtype=np.uint8)
            lookup[h] = np.arange(table.size, dtype=np.uint8)
            return multiplier, lookup
    return None


def value_codes(array: np.ndarray):
    """``(codes, values)`` with ``values[codes]`` equal to ``array`` bit for
    bit: codes uint8 of the array's shape, values the distinct values (at most
    256, compared by their bits, so -0.0 and 0.0 stay apart) in the array's
    dtype, in increasing order of their bits. None when the array holds more
    than 256 distinct values or a dtype other than float64, float32, int64,
    int32.

    The table starts as the values of a sample; every element is
    coded through a perfect hash of the table and checked against it, and the
    values it missed join the table (then the array is coded again)."""
    a = np.ascontiguousarray(array)
    bits_type = _BITS.get(a.dtype)
    if bits_type is None:
        return None
    bits = a.reshape(-1).view(bits_type)
    # The first table: the values of a sample spread over the array.
    table = np.unique(bits[::max(1, bits.size // _SAMPLE)])
    codes = np.empty(bits.size, dtype=np.uint8)
    with np.errstate(over="ignore"):
        while table.size <= MAX_CODED_VALUES:
            found = _perfect_hash(table) if table.size else None
            if found is None and table.size:
                return None
            missed = []
            for start in range(0, bits.size, _CODE_CHUNK):
                chunk = bits[start:start + _CODE_CHUNK]
                c = found[1][_hash(chunk, found[0])]
                wrong = table[c] != chunk
                if wrong.any():
                    missed.append(np.unique(chunk[wrong]))
                    if sum(m.size for m in missed) + table.size > MAX_CODED_VALUES:
                        missed = [np.unique(np.concatenate(missed))]  # chunks may miss the same values
                        if missed[0].size + table.size > MAX_CODED_VALUES:
                            return None
                codes[start:start + chunk.size] = c
            if not missed:
                return codes.reshape(a.shape), table.view(a.dtype)
            table = np.union1d(table, np.concatenate(missed))
    return None


def _read_npy(path: str, what: str) -> np.ndarray:
    try:
        with open(path, "rb") as f:
            return parse_npy(f.read(), path)
    except OSError as e:
        raise RunFormatError("%s: cannot read '%s': %s" % (what, path, e.strerror)) from e


def read_array(directory: str, name: str, what: str) -> np.ndarray:
    """Array ``name`` of a data directory: NAME.npy, or the coded pair
    NAME.codes.npy (uint8, the array's shape) and NAME.values.npy (the 1-D
    table of at most 256 values), read as values[codes]. ``what`` opens the
    messages."""
    plain, codes_path, values_path = (os.path.join(directory, name + suffix)
                                      for suffix in (".npy", ".codes.npy", ".values.npy"))
    has_codes, has_values = os.path.exists(codes_path), os.path.exists(values_path)
    if os.path.exists(plain):
        if has_codes or has_values:
            raise RunFormatError("%s: '%s' holds both %s.npy and the coded pair's %s; expected one of them"
                                 % (what, directory, name, codes_path if has_codes else values_path))
        return _read_npy(plain, what)
    if not (has_codes and has_values):
        raise RunFormatError("%s: '%s' has %s; expected %s.npy or the pair %s.codes.npy and %s.values.npy"
                             % (what, directory, "only " + os.path.basename(codes_path if has_codes else values_path)
                                if has_codes or has_values else "no " + name + ".npy", name, name, name))
    values = _read_npy(values_path, what)
    if values.ndim != 1 or values.shape[0] > MAX_CODED_VALUES or values.dtype not in _BITS:
        raise RunFormatError("%s: '%s' holds %s of shape %s, expected a 1-D table of at most %d values (float64, "
                             "float32, int64 or int32)" % (what, values_path, values.dtype, list(values.shape),
                                                           MAX_CODED_VALUES))
    codes = _read_npy(codes_path, what)
    if codes.dtype != np.uint8 or codes.ndim < 1:
        raise RunFormatError("%s: '%s' holds %s of shape %s, expected uint8 codes with at least one dimension"
                             % (what, codes_path, codes.dtype, list(codes.shape)))
    if codes.size and int(codes.max()) >= values.shape[0]:
        raise RunFormatError("%s: '%s' holds the code %d, out of range of the %d values in '%s'"
                             % (what, codes_path, int(codes.max()), values.shape[0], values_path))
    return values[codes]
