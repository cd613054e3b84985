"""memslim-opt input fuzzing, archive side: the corruptions of a TorchScript archive.

What: the mutators of PT_MUTATORS (byte flips, truncation, zip entries removed / renamed /
duplicated, entry contents mutated in a valid zip: code and pickles with the IR text
mutators, tensor data; not an archive at all), each `(rng, archive bytes) -> bytes`.
Why: bench/fuzz_opt_inputs.py over the size rule; its input mutations, by kind (this module
and _fuzz_opt_ir.py), apart from running and checking memslim-opt. The scripted modules
the archives start from stay in fuzz_opt_inputs.py (their TorchScript names are those of
`__main__`, as they were).
"""

from __future__ import annotations

import io
import zipfile
from typing import List, Optional, Tuple

from _fuzz_opt_ir import (
    _tokens,
    m_drop_lines,
    m_dup_swap_lines,
    m_name_change,
    m_token_swap,
    m_truncate,
)


def _rezip(entries: List[Tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for name, data in entries:
            z.writestr(zipfile.ZipInfo(name), data)
    return buf.getvalue()


def _entries(data: bytes) -> Optional[List[Tuple[str, bytes]]]:
    """The zip's entries, or None when it is no longer a readable zip."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            return [(i.filename, z.read(i.filename)) for i in z.infolist()]
    except Exception:
        return None


def a_byte_flips(rng, data):
    b = bytearray(data)
    for _ in range(rng.randint(1, 16)):
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8) if rng.random() < 0.7 else rng.randrange(256)
    return bytes(b)


def a_truncate(rng, data):
    return data[: rng.randrange(len(data))]


def a_entry_removed(rng, data):
    e = _entries(data)
    if not e:
        return a_byte_flips(rng, data)
    del e[rng.randrange(len(e))]
    return _rezip(e)


def a_entry_renamed_or_duplicated(rng, data):
    e = _entries(data)
    if not e:
        return a_byte_flips(rng, data)
    i = rng.randrange(len(e))
    if rng.random() < 0.5:
        e[i] = (e[i][0] + rng.choice(["x", ".bak", "/"]), e[i][1])
    else:
        e.insert(rng.randrange(len(e) + 1), (e[i][0], e[rng.randrange(len(e))][1]))
    return _rezip(e)


def a_entry_mutated(rng, data):
    e = _entries(data)
    if not e:
        return a_byte_flips(rng, data)
    i = rng.randrange(len(e))
    name, content = e[i]
    if name.endswith(".py") or name.endswith("version") or name.endswith("byteorder"):
        text = content.decode("utf-8", "replace")
        mut = rng.choice([m_drop_lines, m_dup_swap_lines, m_token_swap, m_truncate, m_name_change])
        pool = [text[a:b] for a, b in _tokens(text)] or ["x"]
        new = mut(rng, text, pool)
        content = new if isinstance(new, bytes) else new.encode()
    else:
        content = rng.choice([a_byte_flips, a_truncate])(rng, content) if content else b"\x80"
    e[i] = (name, content)
    return _rezip(e)


def a_not_an_archive(rng, data):
    return rng.choice(
        [b"", b"PK\x03\x04", bytes(rng.randrange(256) for _ in range(64)), data[:30] + bytes(200)]
    )


PT_MUTATORS = {
    "byte-flips": a_byte_flips,
    "truncate": a_truncate,
    "entry-removed": a_entry_removed,
    "entry-renamed-or-duplicated": a_entry_renamed_or_duplicated,
    "entry-mutated": a_entry_mutated,
    "not-an-archive": a_not_an_archive,
}
