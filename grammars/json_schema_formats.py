"""Regexes for JSON Schema `format` values and for bounded JSON numbers.

All regexes are `interegular` syntax with every `/` escaped (they go inside the core's `/.../` terminals), and
each accepts a subset of what the format allows, never more: e.g. dates check the day against the month and
leap years; `hostname` keeps the total length under 253 by bounding the labels; `uri` follows RFC 3986 with
exact percent-encoding. Number regexes are built from digit ranges, so integer bounds are exact.
"""

from __future__ import annotations

import math

_LEAP_YEAR = r"(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)"
_DATE = (
    r"(?:[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
    r"|02-(?:0[1-9]|1[0-9]|2[0-8]))|" + _LEAP_YEAR + r"-02-29)"
)
_TIME = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]+)?(?:Z|[+\-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_IPV4 = rf"{_OCTET}(?:\.{_OCTET}){{3}}"
_H16 = r"[0-9a-fA-F]{1,4}"
_LS32 = rf"(?:{_H16}:{_H16}|{_IPV4})"


def _ipv6() -> str:
    """RFC 3986 `IPv6address`: eight 16-bit groups, one `::` run, optional trailing IPv4."""
    def groups(n: int) -> str:  # exactly n "h16:" groups
        return f"(?:{_H16}:){{{n}}}" if n else ""

    def upto(n: int) -> str:  # [ *n( h16 ":" ) h16 ]
        return f"(?:(?:{_H16}:){{0,{n}}}{_H16})?" if n else f"(?:{_H16})?"

    alts = [groups(6) + _LS32, "::" + groups(5) + _LS32]
    alts += [upto(k) + "::" + groups(4 - k) + _LS32 for k in range(5)]
    alts += [upto(5) + "::" + _H16, upto(6) + "::"]
    return "(?:" + "|".join(alts) + ")"


def _hostname() -> str:
    """Dot-separated labels of letters, digits and inner hyphens, at most 251 characters in all."""
    def label(n: int) -> str:
        return f"[A-Za-z0-9](?:[A-Za-z0-9\\-]{{0,{n - 2}}}[A-Za-z0-9])?"

    # 3 labels of <= 63 (191 chars) or 10 labels of <= 24 (249 chars): both stay under RFC 1123's 253.
    return f"(?:{label(63)}(?:\\.{label(63)}){{0,2}}|{label(24)}(?:\\.{label(24)}){{0,9}})"


def _uri() -> str:
    """RFC 3986 `URI` (scheme, hier-part, query, fragment), percent-encoding exact."""
    unreserved = r"A-Za-z0-9\-._~"
    sub_delims = r"!$&'()*+,;="
    pct = r"%[0-9A-Fa-f]{2}"
    pchar = f"(?:[{unreserved}{sub_delims}:@]|{pct})"
    segment = f"{pchar}*"
    segment_nz = f"{pchar}+"
    reg_name = f"(?:[{unreserved}{sub_delims}]|{pct})*"
    userinfo = f"(?:[{unreserved}{sub_delims}:]|{pct})*"
    host = rf"(?:\[{_ipv6()}\]|{reg_name})"
    authority = f"(?:{userinfo}@)?{host}(?::[0-9]*)?"
    hier = (
        rf"(?:\/\/{authority}(?:\/{segment})*|\/(?:{segment_nz}(?:\/{segment})*)?|{segment_nz}(?:\/{segment})*)?"
    )
    query = rf"(?:{pchar}|[\/?])*"
    return rf"[A-Za-z][A-Za-z0-9+\-.]*:{hier}(?:\?{query})?(?:#{query})?"


_EMAIL = (
    r"[A-Za-z0-9!#$%&'*+\/=?\^_`{|}~\-]+(?:\.[A-Za-z0-9!#$%&'*+\/=?\^_`{|}~\-]+)*"
    r"@[A-Za-z0-9](?:[A-Za-z0-9\-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9\-]*[A-Za-z0-9])?)*"
)

FORMATS: dict[str, str] = {
    "date": _DATE,
    "time": _TIME,
    "date-time": f"{_DATE}T{_TIME}",
    "email": _EMAIL,
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "uri": _uri(),
    "ipv4": _IPV4,
    "ipv6": _ipv6(),
    "hostname": _hostname(),
}

INTEGER = r"-?(?:0|[1-9][0-9]*)"
NUMBER = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+\-]?[0-9]+)?"
_FRACTION = r"\.[0-9]+"


def _same_length(x: str, y: str) -> str:
    """Decimal strings of len(x) digits between x and y (x <= y, same length)."""
    if x == y:
        return x
    if len(x) == 1:
        return f"[{x}-{y}]"
    if x[0] == y[0]:
        return x[0] + _same_length(x[1:], y[1:])
    n = len(x) - 1
    alts = []
    first, last = int(x[0]), int(y[0])
    if x[1:] != "0" * n:
        alts.append(x[0] + _group(_same_length(x[1:], "9" * n)))
        first += 1
    if y[1:] != "9" * n:
        alts.append(y[0] + _group(_same_length("0" * n, y[1:])))
        last -= 1
    if first <= last:
        digit = str(first) if first == last else f"[{first}-{last}]"
        alts.append(f"{digit}[0-9]{{{n}}}")
    return _alternation(alts)


def _group(text: str) -> str:
    return text if len(text) == 1 else f"(?:{text})"


def _alternation(alts: list[str]) -> str:
    return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"


def uint_range(lo: int, hi: int | None) -> str:
    """Regex for non-negative decimal integers without leading zeros in [lo, hi] (hi None: unbounded)."""
    if hi is not None and lo > hi:
        raise ValueError(f"empty integer range [{lo}, {hi}]")
    alts = []
    top_len = len(str(hi)) if hi is not None else len(str(lo))
    for length in range(len(str(lo)), top_len + 1):
        start = max(lo, 10 ** (length - 1) if length > 1 else 0)
        end = 10**length - 1 if hi is None else min(hi, 10**length - 1)
        if start <= end:
            alts.append(_same_length(str(start), str(end)))
    if hi is None:
        alts.append(f"[1-9][0-9]{{{top_len},}}")
    return _alternation(alts)


def integer_range(lo: int | None, hi: int | None) -> str:
    """Regex for JSON integers in [lo, hi] (None: unbounded on that side); `-0` is never produced."""
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"empty integer range [{lo}, {hi}]")
    alts = []
    if hi is None or hi >= 0:
        alts.append(uint_range(max(lo, 0) if lo is not None else 0, hi))
    if lo is None or lo < 0:  # negatives -m with m in [max(1, -hi), -lo]
        m_lo = max(1, -hi) if hi is not None else 1
        alts.append("-" + _group(uint_range(m_lo, -lo if lo is not None else None)))
    return _alternation(alts)


def _nonneg_decimal(lo: int, lo_excl: bool, hi: int | None, hi_excl: bool) -> str | None:
    """Regex for non-negative decimals P (no exponent) with lo <(=) P <(=) hi, lo/hi integers; None if empty.

    With I the integer part and f the fraction: P >= lo iff I >= lo; P > lo iff I > lo or (I == lo, f > 0);
    P <= hi iff I < hi or (I == hi, f == 0); P < hi iff I < hi.
    """
    alts = []
    any_lo = lo + 1 if lo_excl else lo
    any_hi = None if hi is None else hi - 1
    if any_hi is None or any_lo <= any_hi:
        alts.append(_group(uint_range(any_lo, any_hi)) + f"(?:{_FRACTION})?")
    if lo_excl and (hi is None or lo < hi):
        alts.append(str(lo) + r"\.[0-9]*[1-9][0-9]*")
    if hi is not None and not hi_excl and (hi > lo or (hi == lo and not lo_excl)):
        alts.append(str(hi) + r"(?:\.0+)?")
    return _alternation(alts) if alts else None


def number_range(lo: float | None, lo_excl: bool, hi: float | None, hi_excl: bool) -> tuple[str, bool]:
    """Regex for JSON numbers within the bounds, and whether it is exact.

    Integer-valued bounds are exact (without exponents, which bounded numbers never need); other bounds are
    widened to the enclosing integers and reported as inexact by the caller.
    """
    exact = True
    ilo = ihi = None
    if lo is not None:
        ilo = math.floor(lo)
        if ilo != lo:
            exact, lo_excl = False, False
    if hi is not None:
        ihi = math.ceil(hi)
        if ihi != hi:
            exact, hi_excl = False, False
    alts = []
    if ihi is None or ihi >= 0:  # x = P >= 0
        if ilo is None or ilo < 0:
            p_lo, p_lo_excl = 0, False
        else:
            p_lo, p_lo_excl = ilo, lo_excl
        pos = _nonneg_decimal(p_lo, p_lo_excl, ihi, hi_excl)
        if pos is not None:
            alts.append(pos)
    if ilo is None or ilo < 0:  # x = -P with P > 0
        if ihi is None or ihi >= 0:
            n_lo, n_lo_excl = 0, True
        else:
            n_lo, n_lo_excl = -ihi, hi_excl
        neg = _nonneg_decimal(n_lo, n_lo_excl, None if ilo is None else -ilo, lo_excl)
        if neg is not None:
            alts.append("-" + _group(neg))
    if not alts:
        raise ValueError(f"empty number range ({lo}, {hi})")
    return _alternation(alts), exact
