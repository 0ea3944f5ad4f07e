"""Strings: formatting, concatenation, splitting, joining, searching and case changes."""

# ruff: noqa: UP031 (%-formatting is part of what these programs exercise)


def bench():
    words = []
    for i in range(40_000):
        words.append(f"w{i:05d}-{i % 97}")
    text = " ".join(words)
    assert len(text.split()) == 40_000
    upper = text.upper()
    assert upper.count("W") == 40_000 and upper.count("W0") == 10_000
    replaced = text.replace("-", "_")
    assert replaced.find("w39999_") > 0 and "-" not in replaced
    pieces = []
    for word in words:
        stem, _, tail = word.partition("-")
        pieces.append(tail + stem[::-1])
    joined = "".join(pieces)
    assert joined.startswith("000000w") and joined.endswith("3599993w")
    assert sum(1 for w in words if w.endswith("-0")) == 413
    centred = "|".join(s.center(10, ".") for s in words[:5000])
    assert len(centred) == 5000 * 10 + 4999
    assert "%s=%d" % ("answer", 42) + "{:>6}".format("x") == "answer=42     x"
