"""float32 results written as TEI writes them in JSON: the shortest decimal that reads back as
the same float32 (serde_json's ryu), not the 17-digit text of the float64 it widens to.

A client parsing TEI's `-0.03447724` gets another Python float than one parsing
`-0.03447724133729935`; both are one float32, but vectors cached from TEI would compare
unequal to ours, and the long text makes an /embed answer ~1.7x larger. orjson writes numpy
float32 arrays with ryu's float32 form (NaN as null, like serde_json), as fast as msgspec
writes the float64 lists.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import numpy as np
import numpy.typing as npt
import orjson

_NUMPY = orjson.OPT_SERIALIZE_NUMPY


def json_array(values: npt.ArrayLike) -> msgspec.Raw:
    """A float32 vector or matrix as JSON text, to stand in a msgspec-encoded answer."""
    array = np.ascontiguousarray(values, dtype=np.float32)
    return msgspec.Raw(orjson.dumps(array, option=_NUMPY))


def json_scores(scores: Sequence[float]) -> list[float]:
    """Scores (float32 results held as Python floats) as the floats TEI's JSON text reads back
    as; msgspec writes each of those with the same shortest digits."""
    text = orjson.dumps(np.asarray(scores, dtype=np.float32), option=_NUMPY)
    read: list[float] = orjson.loads(text)
    return read
