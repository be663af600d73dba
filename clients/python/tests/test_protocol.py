"""The client's constants are the rules every client shares: the `protocol`
block of clients/scenarios.json (docs/client-protocol.md, "The rules every
client shares")."""

import json

import redis

import redis_flock._core as core
from redis_flock import Lock
from test_scenarios import scenarios_file

PROTOCOL = json.loads(scenarios_file().read_text())["protocol"]


def test_the_constants_are_the_shared_protocol():
    assert core.HEARTBEAT_FRACTION == PROTOCOL["heartbeat_fraction"]
    assert core.DRIFT_MARGIN * 1000 == PROTOCOL["drift_margin_ms"]
    assert core.DRIFT_MARGIN_PERCENT == PROTOCOL["drift_margin_percent"]
    assert core.WATCHDOG_TIMEOUT * 1000 == PROTOCOL["watchdog_lease_ms"]
    assert core.WATCHDOG_RENEW_FRACTION == PROTOCOL["watchdog_renew_fraction"]
    assert core.RESENDS == PROTOCOL["resends"]
    assert core.CANCEL_GRACE * 1000 == PROTOCOL["cancel_grace_ms"]
    assert list(core.LOSS_REASONS) == PROTOCOL["loss_reasons"]


def test_the_margin_is_10_ms_and_1_percent():
    assert abs(core.drift_margin(10.0) - 0.110) < 1e-9
    assert abs(core.drift_margin(0.4) - 0.014) < 1e-9


def test_a_wait_by_default_lasts_until_granted():
    # blocking_timeout=None: WAIT 0, no limit (Lock.lock() in Java).
    lock = Lock(redis.Redis(), "default")
    assert lock._wait_ms(None, None) == 0
