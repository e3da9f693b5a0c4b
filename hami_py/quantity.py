"""Kubernetes resource quantities (``"10"``, ``"1Gi"``, ``"1e3"``, ``"500m"``) as Python integers.

HAMi reads its device resources (``nvidia.com/gpu``, ``nvidia.com/gpumem``, ...) as whole numbers:
a value that is not an exact integer is not a usable request. Admission-time checks instead use
the value rounded up, as Kubernetes' ``Quantity.Value()`` does. Both need the same parser.

The arithmetic is done on exact integers (mantissa x 10^e x 2^b), never on floats or a
limited-precision Decimal context, so ``"123456789012345678Ki"`` is judged exactly. The pods we
read come from the API server, which stores quantities in canonical form; judging the *value*
(not the spelling) therefore gives the same answer as upstream's ``AsInt64`` on every quantity
the API server can hand us, and a sensible one on hand-written input such as ``"1000m"``.

Results are limited to the int64 range, like upstream's ``AsInt64``: anything larger is not a
number any HAMi resource can hold, and the limit keeps absurd exponents (``"1e999999999"``) from
turning into huge integers.
"""
from __future__ import annotations

import re

# Go's integer bounds, for the fields upstream declares as these types.
INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1
UINT32_MAX = (1 << 32) - 1
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1
UINT64_MAX = (1 << 64) - 1

# sign, integer digits, optional fraction, then whatever follows (the suffix).
_NUMBER = re.compile(r"([+-]?)([0-9]*)(?:\.([0-9]*))?(.*)", re.ASCII | re.DOTALL)
_EXPONENT = re.compile(r"[+-]?[0-9]+", re.ASCII)

# suffix -> (power of ten, power of two)
_SUFFIXES: dict[str, tuple[int, int]] = {
    "": (0, 0),
    "n": (-9, 0), "u": (-6, 0), "m": (-3, 0),
    "k": (3, 0), "M": (6, 0), "G": (9, 0), "T": (12, 0), "P": (15, 0), "E": (18, 0),
    "Ki": (0, 10), "Mi": (0, 20), "Gi": (0, 30), "Ti": (0, 40), "Pi": (0, 50), "Ei": (0, 60),
}

# Beyond this many decimal digits a value is far outside int64; stop before building the integer.
_MAX_DIGITS = 40
# Longer mantissas are refused outright: no real quantity has them, and Python will not convert
# digit strings of more than a few thousand characters.
_MAX_MANTISSA_DIGITS = 1000


def _split(value: str) -> tuple[int, int, int, int] | None:
    """``value`` as (signed mantissa, power of ten, power of two, mantissa digits), or None.

    Trailing zeros move from the mantissa into the power of ten, so ``"1.000"`` and ``"1"``
    compare alike and the digit count measures the significant digits only.
    """
    match = _NUMBER.fullmatch(value)
    if match is None:
        return None
    sign, whole, fraction, suffix = match.groups()
    fraction = fraction or ""
    if not whole and not fraction:
        return None
    scale = _SUFFIXES.get(suffix)
    if scale is None:
        if len(suffix) < 2 or suffix[0] not in "eE" or not _EXPONENT.fullmatch(suffix, 1):
            return None
        if len(suffix) > 20:
            return None  # an exponent beyond int64: not a quantity
        scale = (int(suffix[1:]), 0)
    digits = (whole + fraction).lstrip("0")
    significant = digits.rstrip("0")
    if len(significant) > _MAX_MANTISSA_DIGITS:
        return None
    ten = scale[0] - len(fraction) + (len(digits) - len(significant))
    mantissa = int(significant) if significant else 0
    if sign == "-":
        mantissa = -mantissa
    return mantissa, ten, scale[1], len(significant)


def _to_parts(value: object) -> tuple[int, int, int, int] | None:
    """Any accepted input (quantity string, int, float) as (mantissa, ten, two, digits)."""
    kind = type(value)
    if kind is int:
        if not INT64_MIN <= value <= INT64_MAX:
            return None
        return value, 0, 0, len(str(abs(value)))
    if kind is str:
        return _split(value)
    if kind is float:
        # repr() gives the shortest decimal that reads back as the same float ("1e+20", "0.5").
        return _split(repr(value))
    return None


def _integer_digits(digits: int, ten: int, two: int) -> int:
    """An upper bound on the number of decimal digits of the value's integer part."""
    # 2^b has at most b*0.302+1 digits; 31/100 over-estimates log10(2) safely.
    return digits + ten + (two * 31) // 100 + 1


def parse_exact_int(value: object) -> int | None:
    """The quantity as an exact integer within int64, or None.

    None means: not a quantity at all, not a whole number (``"500m"``, ``"1.5"``), or outside
    int64. ``bool`` is refused even though Python treats it as an int.
    """
    if type(value) is str and value.isdigit() and value.isascii() and len(value) < 19:
        return int(value)  # fast path: plain decimal digits, the common case (18 digits always fit)
    parts = _to_parts(value)
    if parts is None:
        return None
    mantissa, ten, two, digits = parts
    if mantissa == 0:
        return 0
    if _integer_digits(digits, ten, two) > _MAX_DIGITS:
        return None
    if ten >= 0:
        number = mantissa * 10**ten << two
    else:
        # Whole only if 10^-ten divides mantissa * 2^two ("0.5Ki" = 512 is). The factors of 5
        # must all come from the mantissa, which then has at least 0.69 * -ten digits: a cheap
        # test that also keeps 10^-ten small.
        if -ten > 2 * digits:
            return None
        number, remainder = divmod(mantissa << two, 10**-ten)
        if remainder:
            return None
    return number if INT64_MIN <= number <= INT64_MAX else None


def parse_quantity_ceil(value: object) -> int | None:
    """The quantity rounded up (away from zero, as Kubernetes' ``Value()``), or None.

    Used where upstream checks the rounded-up value at admission time (e.g. the memory
    percentage must lie in 0..100). None for garbage and for values outside int64.
    """
    parts = _to_parts(value)
    if parts is None:
        return None
    mantissa, ten, two, digits = parts
    if ten >= 0 or mantissa == 0:
        return parse_exact_int(value)
    if _integer_digits(digits, ten, two) > _MAX_DIGITS:
        return None
    if _integer_digits(digits, ten, two) < 0:
        rounded = 1  # below one but not zero (e.g. "1e-999999"): rounds up to one
    else:
        rounded = -(-(abs(mantissa) << two) // 10**-ten)
    number = rounded if mantissa > 0 else -rounded
    return number if INT64_MIN <= number <= INT64_MAX else None
