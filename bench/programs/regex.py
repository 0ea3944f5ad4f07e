"""Regular expressions: compile, findall, finditer with groups, sub and split."""

import re


def make_log(n):
    lines = []
    for i in range(n):
        level = ("INFO", "WARN", "ERROR")[i % 3]
        lines.append(
            f"2026-01-{i % 28 + 1:02d} 12:{i % 60:02d}:{(i * 7) % 60:02d} {level} "
            f"user{i % 50}@example.org took {i % 997} ms on /api/v{i % 3}/item/{i}"
        )
    return "\n".join(lines)


def bench():
    log = make_log(8_000)
    line_re = re.compile(r"^(\d{4})-(\d\d)-(\d\d) [\d:]+ (ERROR) (\S+)@", re.MULTILINE)
    errors = [m.group(5) for m in line_re.finditer(log)]
    durations = [int(d) for d in re.findall(r"took (\d+) ms", log)]
    paths = re.findall(r"/api/v([0-9])/item/(\d+)", log)
    masked = re.sub(r"[a-z]+\d+@example\.org", "<user>", log)
    fields = re.split(r"[ :/@-]+", log[:100_000])
    assert len(errors) == 2_666 and errors[0] == "user2"
    assert sum(durations) == sum(i % 997 for i in range(8_000))
    assert len(paths) == 8_000 and paths[-1] == ("1", "7999")
    assert masked.count("<user>") == 8_000
    assert len(fields) > 10_000
