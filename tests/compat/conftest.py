"""Keeps docs/api.md's table of tb-rest-client methods honest.

Every public method of tb-rest-client's `RestClient` is wrapped to record the calls a test
makes that return without an error (a test's own call, not the calls a method makes
inside). When the whole compatibility suite ran and passed, the table "tb-rest-client 4.4,
method by method" in docs/api.md is checked against it: every method of the controllers it
covers has a row, and every row marked "works" was called by a test here. A mismatch fails
the run, naming the methods.
"""

import inspect
import os
import pathlib
import re
import threading

import pytest
from tb_rest_client.rest_client import RestClient

# The areas issues 32 and 34 (alarms) ask about, by the client's controller attributes.
CONTROLLERS = [
    "device_controller",
    "device_profile_controller",
    "asset_controller",
    "asset_profile_controller",
    "entity_relation_controller",
    "telemetry_controller",
    "customer_controller",
    "user_controller",
    "dashboard_controller",
    "ota_package_controller",
    "entity_query_controller",
    "owner_controller",
    "tenant_profile_controller",
    "alarm_controller",
    "alarm_comment_controller",
    "alarm_rule_controller",
]
HERE = pathlib.Path(__file__).parent
API_MD = HERE.parent.parent / "docs" / "api.md"
TABLE = "### tb-rest-client 4.4, method by method"

CALLED = set()
_depth = threading.local()


def _recorded(name, fn):
    def call(self, *args, **kwargs):
        outer = getattr(_depth, "n", 0) == 0
        _depth.n = getattr(_depth, "n", 0) + 1
        try:
            out = fn(self, *args, **kwargs)
        finally:
            _depth.n -= 1
        if outer:
            CALLED.add(name)
        return out

    call.__name__ = name
    call.__doc__ = fn.__doc__
    return call


def covered_methods():
    """{method: controller} for the public methods that call one of CONTROLLERS."""
    out = {}
    for name, fn in inspect.getmembers(RestClient, inspect.isfunction):
        if name.startswith("_"):
            continue
        used = set(re.findall(r"self\.(\w+_controller)\.", inspect.getsource(fn)))
        for c in CONTROLLERS:
            if c in used:
                out[name] = c
    return out


COVERED = covered_methods()
for _name, _fn in inspect.getmembers(RestClient, inspect.isfunction):
    _plain = not isinstance(inspect.getattr_static(RestClient, _name), (staticmethod, classmethod))
    if not _name.startswith("_") and _plain:
        setattr(RestClient, _name, _recorded(_name, _fn))


def table_rows():
    """{method: status} from docs/api.md's table."""
    text = API_MD.read_text()
    start = text.index(TABLE)
    end = text.find("\n## ", start)
    rows = {}
    for line in text[start:end if end > 0 else None].splitlines():
        m = re.match(r"\| `(\w+)` \| ([^|]+) \|", line)
        if m:
            rows[m.group(1)] = m.group(2).strip()
    return rows


def pytest_sessionfinish(session, exitstatus):
    # COMPAT_CALLED_OUT=file: where to list the methods called, to write the table from.
    out = os.environ.get("COMPAT_CALLED_OUT")
    if out:
        pathlib.Path(out).write_text("".join(f"{COVERED.get(m, '-')} {m}\n" for m in sorted(CALLED)))
    ran = {pathlib.Path(str(item.fspath)).name for item in session.items}
    every = {p.name for p in HERE.glob("test_*.py")}
    if exitstatus != 0 or ran != every or session.config.option.keyword:
        return
    rows = table_rows()
    missing = sorted(set(COVERED) - set(rows))
    unproven = sorted(m for m, status in rows.items() if status.startswith("works") and m not in CALLED)
    unknown = sorted(set(rows) - set(COVERED))
    if missing or unproven or unknown:
        print(f"\ndocs/api.md '{TABLE[4:]}' does not match the suite:")
        if missing:
            print(f"  methods without a row: {', '.join(missing)}")
        if unproven:
            print(f"  rows marked works that no test here called successfully: {', '.join(unproven)}")
        if unknown:
            print(f"  rows naming no method of the covered controllers: {', '.join(unknown)}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
