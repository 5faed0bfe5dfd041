"""Every number servescope writes as text, one function per form: percent, milliseconds, seconds, counts, sizes."""

from __future__ import annotations

import math

MISSING = "n/a"  # what a value that was not measured reads as, unless a caller's table says "-" or why
_MISSING_WHEN = ("None", "None or NaN", "None or not finite", "not a number")


def _missing(value: object, when: str) -> bool:
    if when not in _MISSING_WHEN:
        raise ValueError(f"missing_when is one of {', '.join(_MISSING_WHEN)}, not {when!r}")
    if when == "not a number":  # a JSON value of any type: only an int or a float is shown
        return not isinstance(value, (int, float))
    if value is None:
        return True
    if when == "None or NaN":
        return isinstance(value, float) and math.isnan(value)
    return when == "None or not finite" and isinstance(value, float) and not math.isfinite(value)


# ---------------------------------------------------------------- shares


def percent(value: float | None, digits: int = 1, missing: str = MISSING) -> str:
    """A share 0..1 as a percentage: 0.125 -> "12.5%" (digits=0: "12%")."""
    return missing if value is None else f"{value:.{digits}%}"


def percent_figure(value: float | None, digits: int = 1, missing: str = MISSING) -> str:
    """A figure already in percent (an error, a MAPE): 12.5 -> "12.5%"."""
    return missing if value is None else f"{value:.{digits}f}%"


def percent_significant(value: float, digits: int = 3) -> str:
    """A share 0..1 as a percentage to significant digits (an axis tick): 0.125 -> "12.5%", 0.5 -> "50%"."""
    return f"{value * 100:.{digits}g}%"


def percent_range(low: float, high: float) -> str:
    """Two shares as a band of whole percents: (0.88, 0.97) -> "88-97%"."""
    return f"{low * 100:.0f}-{high:.0%}"


def percentage_points(value: float, signed: bool = False) -> str:
    """A difference of two shares in points: 0.021 -> "2.1 pp" (signed: "+2.1 pp")."""
    return f"{value * 100:{'+' if signed else ''}.1f} pp"


def cores(value: float) -> str:
    """CPU time as cores: 0.61 -> "61% of a core"; 1.4 -> "1.4 cores"."""
    return f"{value:.0%} of a core" if value < 0.995 else f"{value:.1f} cores"


# ---------------------------------------------------------------- times


def seconds(value: float | None, digits: int = 3, missing: str = MISSING) -> str:
    """Seconds to fixed decimals, the unit attached: 0.25 -> "0.250s"."""
    return missing if value is None else f"{value:.{digits}f}s"


def milliseconds(value: float | None, digits: int = 1, missing: str = MISSING, unit: str = "") -> str:
    """Seconds shown in milliseconds: 0.0123 -> "12.3" (a table's column names the unit; unit=" ms" writes it)."""
    return missing if value is None else f"{value * 1000:.{digits}f}{unit}"


def duration(value: float, by_magnitude: bool = False) -> str:
    """Seconds to 3 significant digits, in ms under a second: 0.25 -> "250 ms", 1.5 -> "1.5 s".

    by_magnitude: a negative value takes its unit by its size (-2 -> "-2 s", an axis tick); without it any value
    under one (a negative one too) is in ms, as the SLO's words have always said it."""
    small = abs(value) < 1 if by_magnitude else value < 1
    return f"{value * 1000:.3g} ms" if small else f"{value:.3g} s"


def duration_fixed(value: float, signed: bool = False) -> str:
    """Seconds to fixed decimals, in ms under a second: 0.25 -> "250.0 ms", 1.5 -> "1.500 s" (signed: "+250.0 ms")."""
    sign = "+" if signed else ""
    return f"{value * 1000:{sign}.1f} ms" if abs(value) < 1 else f"{value:{sign}.3f} s"


def elapsed(value: float) -> str:
    """Whole seconds passed, as a progress line counts them: 95 -> "95s", 125 -> "2m05s" (fractions dropped)."""
    whole = int(value)
    return f"{whole}s" if whole < 120 else f"{whole // 60}m{whole % 60:02d}s"


def minutes(value: float) -> str:
    """Seconds rounded, in minutes and seconds from one minute: 35 -> "35 s", 95 -> "1 min 35 s"."""
    whole = int(round(value))
    return f"{whole // 60} min {whole % 60} s" if whole >= 60 else f"{whole} s"


# ---------------------------------------------------------------- plain numbers


def number(value: float | None, missing: str = MISSING, unit: str = "") -> str:
    """The shortest form (Python's "g"): 48.0 -> "48", 0.5 -> "0.5"; unit=" u" -> "4 u"."""
    return missing if value is None else f"{value:g}{unit}"


def fixed(
    value: object, digits: int = 2, missing: str = MISSING, signed: bool = False, missing_when: str = "None"
) -> str:
    """Fixed decimals: 1.234 -> "1.23" (signed: "+1.23").

    missing_when says which values read as `missing`: "None"; "None or NaN"; "None or not finite" (inf too);
    "not a number" (anything but an int or a float: a JSON field of another type)."""
    if _missing(value, missing_when):
        return missing
    return f"{value:{'+' if signed else ''}.{digits}f}"


def trimmed(value: object, digits: int = 2) -> str:
    """Fixed decimals for a fraction, the shortest form for a whole number: 0.256 -> "0.26", 3.0 -> "3", 4 -> "4";
    None and a float that is not finite -> "n/a"."""
    if _missing(value, "None or not finite"):
        return MISSING
    return f"{value:.{digits}f}" if isinstance(value, float) and value != int(value) else f"{value:g}"


def significant(value: float | None, digits: int = 3, missing: str = MISSING) -> str:
    """Significant digits, for figures of any size (a token's millijoules, a phase's kilojoules, a cost):
    1234.5 -> "1.23e+03", 0.01234 -> "0.0123"."""
    return missing if value is None else f"{value:.{digits}g}"


def integer(value: int | None, missing: str = MISSING) -> str:
    """A whole count: 3 -> "3" (a float is refused, as a count must not be one)."""
    return missing if value is None else f"{value:d}"


def rate(value: float) -> str:
    """A rate as a person reads it: 2 significant digits under ten, whole from ten: 2.345 -> "2.3", 12.6 -> "13"."""
    return f"{value:.2g}" if value < 10 else f"{value:.0f}"


def grouped(value: float) -> str:
    """Thousands grouped from a thousand, else 3 significant digits: 12345 -> "12,345", 0.1234 -> "0.123"."""
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


# ---------------------------------------------------------------- sizes


def binary_size(value: float) -> str:
    """Bytes in the largest binary unit they fill: 1536 -> "1.5 KiB", 3 * 2**30 -> "3.0 GiB", 512 -> "512 B"."""
    for scale, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(value) >= scale:
            return f"{value / scale:.1f} {name}"
    return f"{value:.0f} B"


def file_size(value: float) -> str:
    """A file's bytes: "2.50 GB" from 2**30 bytes, else whole "MB" (binary units under decimal names, as printed)."""
    return f"{value / 2**30:.2f} GB" if value >= 2**30 else f"{value / 2**20:.0f} MB"


# ---------------------------------------------------------------- in a query


def sql_double(value: float) -> str:
    """A number as a DuckDB DOUBLE literal: 0.1 -> "0.1::DOUBLE" (a bare 0.1 would be a DECIMAL)."""
    return f"{float(value)!r}::DOUBLE"
