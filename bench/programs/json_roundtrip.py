"""json: serialise and parse a nested document of records."""

# ruff: noqa: UP031 (%-formatting is part of what these programs exercise)

import json


def make_document(n):
    return {
        "version": 3,
        "records": [
            {
                "id": i,
                "name": "item-%d" % i,
                "price": i * 0.25,
                "tags": ["t%d" % (i % 7), "t%d" % (i % 11)],
                "active": i % 3 == 0,
                "parent": None if i % 10 else i // 10,
            }
            for i in range(n)
        ],
    }


def bench():
    document = make_document(3_000)
    text = json.dumps(document)
    pretty = json.dumps(document, indent=2, sort_keys=True)
    back = json.loads(text)
    again = json.loads(pretty)
    assert back == document and again == document
    assert sum(r["id"] for r in back["records"] if r["active"]) == sum(range(0, 3_000, 3))
    assert len(text) == 315_729, len(text)
