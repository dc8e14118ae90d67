"""Compatibility test: ThingsBoard's official Python device SDK against GridLinks.

The SDK (PyPI `tb-mqtt-client`, version pinned in requirements.txt next to this
file; modules `tb_device_mqtt` and `tb_gateway_mqtt`) is used unchanged. It
speaks MQTT 5 (paho `protocol=5`). The test starts its own gridlinks server on
free loopback ports with a temporary data dir, creates the devices over REST
with `requests`, drives them through the SDK, reads the results back over REST,
and stops the server with SIGTERM.

    pip install -r tests/compat/requirements.txt
    python3 -m pytest -q tests/compat

GRIDLINKS_BIN selects the binary (default: target/debug/gridlinks of this repository).

The steps are separate test functions that share one server, one device and one
SDK connection, so they run in file order. Every wait is bounded by WAIT_S.
"""

import json
import threading
import time
import uuid

import pytest
import requests

from gridlinks_server import activated_customer_user, gridlinks_server, wait_until

from tb_device_mqtt import TBDeviceMqttClient, TBPublishInfo

try:
    from tb_gateway_mqtt import TBGatewayMqttClient
except ImportError:  # an SDK without the gateway client
    TBGatewayMqttClient = None

ADMIN_USER = "admin"
ADMIN_PASSWORD = "sdk-pw-" + uuid.uuid4().hex[:8]
DEVICE_NAME = "sdk-dev"
DEVICE_TOKEN = "sdkTok" + uuid.uuid4().hex[:12]
GATEWAY_NAME = "sdk-gw"
GATEWAY_TOKEN = "sdkGwTok" + uuid.uuid4().hex[:12]
SUB_DEVICE_NAME = "sdk-sub-" + uuid.uuid4().hex[:6]
SUB_DEVICE_TYPE = "sdk-sensor"

WAIT_S = 60  # upper bound of every wait in this file: a hang guard, each wait ends once its condition holds
HTTP_TIMEOUT = 60  # a hang guard, above the RPC timeouts below

NOW_MS = int(time.time() * 1000)
TELEMETRY_TS = NOW_MS - 45_000
TELEMETRY_TS_VALUES = {"temperature": 23.5, "humidity": 41, "active": True, "label": "lab-3"}
TELEMETRY_PLAIN = {"pressure": 1013.25, "count": 7}
CLIENT_ATTRS = {"fwVersion": "2.0.1", "serial": 12345, "calibrated": True, "ratio": 0.5}
SHARED_ATTRS = {"targetTemp": 22.5, "mode": "eco"}
GW_TS = NOW_MS - 15_000
GW_VALUES = {"voltage": 229.5, "rssi": -71, "door": False}


class Calls:
    """Collects callback invocations from the SDK's network thread."""

    def __init__(self):
        self.items = []
        self._cond = threading.Condition()

    def __call__(self, *args):
        with self._cond:
            self.items.append(args)
            self._cond.notify_all()

    def wait(self, count=1, timeout=WAIT_S, what="a callback"):
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.items) >= count, timeout=timeout):
                pytest.fail(f"timed out after {timeout} s waiting for {what} (got {self.items!r})")
            return list(self.items)


def _assert_published(info):
    """An SDK publish result: queued without error, then acknowledged by the server."""
    assert isinstance(info, TBPublishInfo)
    assert info.get() == TBPublishInfo.TB_ERR_SUCCESS, info.rc()
    # get() waits at most 1 s per message and returns the rc of the publish call;
    # is_published() is only true after the server's PUBACK (QoS 1, GridLinks sends
    # it after the durable commit).
    infos = info.message_info if isinstance(info.message_info, list) else [info.message_info]
    assert infos, "the SDK sent nothing"
    for mi in infos:
        mi.wait_for_publish(timeout=WAIT_S)
        assert mi.is_published(), f"no PUBACK for mid {mi.mid} within {WAIT_S} s"


# ---------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # GRIDLINKS_RPC_MIN_TIMEOUT: RPC timeouts below the default minimum are allowed.
    with gridlinks_server(tmp_path_factory.mktemp("gridlinks-mqtt"), ADMIN_PASSWORD, GRIDLINKS_RPC_MIN_TIMEOUT="100") as s:
        yield s


@pytest.fixture(scope="module")
def rest(server):
    """A requests session logged in as the tenant admin."""
    r = requests.post(server["base"] + "/api/auth/login",
                      json={"username": ADMIN_USER, "password": ADMIN_PASSWORD}, timeout=HTTP_TIMEOUT)
    assert r.status_code == 200, r.text
    s = requests.Session()
    s.headers["X-Authorization"] = "Bearer " + r.json()["token"]
    yield s
    s.close()


def _create_device(server, rest, token, body):
    r = rest.post(f"{server['base']}/api/device", params={"accessToken": token}, json=body, timeout=HTTP_TIMEOUT)
    assert r.status_code == 200, r.text
    device = r.json()
    assert device["name"] == body["name"]
    assert device["id"]["entityType"] == "DEVICE"
    uuid.UUID(device["id"]["id"])
    return device["id"]["id"]


@pytest.fixture(scope="module")
def device_id(server, rest):
    return _create_device(server, rest, DEVICE_TOKEN, {"name": DEVICE_NAME, "type": "default"})


@pytest.fixture(scope="module")
def sdk(server, device_id):
    client = TBDeviceMqttClient("127.0.0.1", port=server["mqtt_port"], username=DEVICE_TOKEN)
    # No connect(callback=...): tb-mqtt-client 1.13.14 stores the callback only after
    # loop_start(), so a CONNACK handled before that assignment never calls it (a race
    # in the SDK, about 1 in 10 connects on loopback). is_connected() is the signal.
    client.connect()
    yield client
    client.stop()  # ends the SDK's service and timeout threads
    client.disconnect()


def _latest(server, rest, device_id, keys):
    r = rest.get(f"{server['base']}/api/plugins/telemetry/DEVICE/{device_id}/values/timeseries",
                 params={"keys": ",".join(keys), "useStrictDataTypes": "true"}, timeout=HTTP_TIMEOUT)
    assert r.status_code == 200, r.text
    return r.json()


def _attributes(server, rest, device_id, scope):
    r = rest.get(f"{server['base']}/api/plugins/telemetry/DEVICE/{device_id}/values/attributes/{scope}",
                 timeout=HTTP_TIMEOUT)
    assert r.status_code == 200, r.text
    return r.json()


def _post_shared(server, rest, device_id, attrs):
    r = rest.post(f"{server['base']}/api/plugins/telemetry/DEVICE/{device_id}/attributes/SHARED_SCOPE",
                  json=attrs, timeout=HTTP_TIMEOUT)
    assert r.status_code == 200, r.text


# ---------------------------------------------------------------- steps

def test_connect(sdk):
    client = sdk
    # True only after a CONNACK with reason code 0 (MQTT 5).
    wait_until(client.is_connected, "the SDK to report a connection")
    # On connect the SDK asks for its session limits with the client-side RPC
    # getSessionLimits; GridLinks answers with its real limits (65536-byte packets,
    # no rate limits), which the SDK applies (scaled by its safety percentage).
    wait_until(lambda: client.rate_limits_received, "an answer to the SDK's getSessionLimits RPC")
    from tb_device_mqtt import DEFAULT_RATE_LIMIT_PERCENTAGE
    assert client.max_payload_size == int(65536 * DEFAULT_RATE_LIMIT_PERCENTAGE / 100)


def test_send_telemetry_and_read_back(server, rest, device_id, sdk):
    client = sdk
    before = int(time.time() * 1000)
    _assert_published(client.send_telemetry({"ts": TELEMETRY_TS, "values": TELEMETRY_TS_VALUES}))
    _assert_published(client.send_telemetry(TELEMETRY_PLAIN))  # no ts: the server stamps it
    after = int(time.time() * 1000)

    got = _latest(server, rest, device_id, list(TELEMETRY_TS_VALUES) + list(TELEMETRY_PLAIN))
    assert set(got) == set(TELEMETRY_TS_VALUES) | set(TELEMETRY_PLAIN)
    for key, value in TELEMETRY_TS_VALUES.items():
        assert got[key] == [{"ts": TELEMETRY_TS, "value": value}], key
        assert type(got[key][0]["value"]) is type(value), key
    for key, value in TELEMETRY_PLAIN.items():
        (point,) = got[key]
        assert point["value"] == value and type(point["value"]) is type(value), key
        assert before - 1000 <= point["ts"] <= after + 1000, (key, point, before, after)


def test_send_attributes_and_read_back(server, rest, device_id, sdk):
    _assert_published(sdk.send_attributes(CLIENT_ATTRS))
    attrs = _attributes(server, rest, device_id, "CLIENT_SCOPE")
    got = {a["key"]: a["value"] for a in attrs}
    assert got == CLIENT_ATTRS
    for a in attrs:
        assert type(a["value"]) is type(CLIENT_ATTRS[a["key"]]), a
        assert abs(a["lastUpdateTs"] - int(time.time() * 1000)) < 60_000, a


def test_request_attributes(server, rest, device_id, sdk):
    client = sdk
    _post_shared(server, rest, device_id, SHARED_ATTRS)
    calls = Calls()
    info = client.request_attributes(client_keys=["fwVersion", "serial"], shared_keys=["targetTemp", "mode"],
                                     callback=calls)
    _assert_published(info)
    ((content, error),) = calls.wait(what="the attribute request callback")
    assert error is None
    assert content == {"client": {"fwVersion": "2.0.1", "serial": 12345},
                       "shared": {"targetTemp": 22.5, "mode": "eco"}}

    # Only client keys / only shared keys: the answer has only that part.
    calls = Calls()
    _assert_published(client.request_attributes(client_keys=["calibrated", "ratio"], callback=calls))
    ((content, error),) = calls.wait(what="the client-keys-only attribute request callback")
    assert error is None
    assert content == {"client": {"calibrated": True, "ratio": 0.5}}

    calls = Calls()
    _assert_published(client.request_attributes(shared_keys=["mode"], callback=calls))
    ((content, error),) = calls.wait(what="the shared-keys-only attribute request callback")
    assert error is None
    assert content == {"shared": {"mode": "eco"}}


def test_subscribe_to_shared_attribute_updates(server, rest, device_id, sdk):
    client = sdk
    one_key = Calls()
    every = Calls()
    sub_one = client.subscribe_to_attribute("setpoint", one_key)
    sub_all = client.subscribe_to_all_attributes(every)
    assert isinstance(sub_one, int) and isinstance(sub_all, int) and sub_one != sub_all

    _post_shared(server, rest, device_id, {"setpoint": 19.5})
    ((content, error),) = one_key.wait(what="the 'setpoint' subscription callback")
    assert (content, error) == ({"setpoint": 19.5}, None)
    ((content, error),) = every.wait(what="the all-attributes subscription callback")
    assert (content, error) == ({"setpoint": 19.5}, None)

    # Another key reaches only the all-attributes subscription.
    _post_shared(server, rest, device_id, {"schedule": "weekday", "enabled": True})
    items = every.wait(count=2, what="the second all-attributes update")
    assert items[1] == ({"schedule": "weekday", "enabled": True}, None)
    assert len(one_key.items) == 1, one_key.items

    # After unsubscribing nothing more arrives there; the other one still gets it.
    client.unsubscribe_from_attribute(sub_one)
    _post_shared(server, rest, device_id, {"setpoint": 21.0})
    items = every.wait(count=3, what="the third all-attributes update")
    assert items[2] == ({"setpoint": 21.0}, None)
    assert len(one_key.items) == 1, one_key.items
    client.unsubscribe_from_attribute(sub_all)

    # The shared attributes are stored as such.
    got = {a["key"]: a["value"] for a in _attributes(server, rest, device_id, "SHARED_SCOPE")}
    assert got == dict(SHARED_ATTRS, setpoint=21.0, schedule="weekday", enabled=True)


def test_server_side_rpc(server, rest, device_id, sdk):
    client = sdk
    requests_seen = []
    reply = {"ok": True, "pin": 7, "state": "high", "level": 0.75}

    def handler(request_id, request_body):
        requests_seen.append((request_id, request_body))
        client.send_rpc_reply(request_id, reply)

    client.set_server_side_rpc_request_handler(handler)
    try:
        r = requests.post(f"{server['base']}/api/plugins/rpc/twoway/{device_id}",
                          headers=rest.headers, timeout=HTTP_TIMEOUT,
                          json={"method": "setGpio", "params": {"pin": 7, "value": 1}, "timeout": 30000})
        assert r.status_code == 200, r.text
        assert r.json() == reply
        assert len(requests_seen) == 1, requests_seen
        request_id, request_body = requests_seen[0]
        assert isinstance(request_id, str) and request_id.isdigit(), request_id
        assert request_body == {"method": "setGpio", "params": {"pin": 7, "value": 1}}

        # A second call gets a new request id and its own answer.
        r = requests.post(f"{server['base']}/api/plugins/rpc/twoway/{device_id}",
                          headers=rest.headers, timeout=HTTP_TIMEOUT,
                          json={"method": "getState", "params": {}, "timeout": 30000})
        assert r.status_code == 200, r.text
        assert r.json() == reply
        assert len(requests_seen) == 2, requests_seen
        assert requests_seen[1][1] == {"method": "getState", "params": {}}
        assert requests_seen[1][0] != request_id
    finally:
        client.set_server_side_rpc_request_handler(None)


@pytest.mark.skipif(TBGatewayMqttClient is None, reason="this tb-mqtt-client has no tb_gateway_mqtt")
def test_gateway_sub_device_telemetry(server, rest):
    gateway_id = _create_device(server, rest, GATEWAY_TOKEN,
                                {"name": GATEWAY_NAME, "type": "gateway", "additionalInfo": {"gateway": True}})
    gw = TBGatewayMqttClient("127.0.0.1", port=server["mqtt_port"], username=GATEWAY_TOKEN)
    gw.connect()  # no callback: see the sdk fixture
    try:
        wait_until(gw.is_connected, "the gateway client to report a connection")

        _assert_published(gw.gw_connect_device(SUB_DEVICE_NAME, device_type=SUB_DEVICE_TYPE))
        _assert_published(gw.gw_send_telemetry(SUB_DEVICE_NAME, {"ts": GW_TS, "values": GW_VALUES}))

        r = rest.get(f"{server['base']}/api/tenant/devices", params={"deviceName": SUB_DEVICE_NAME},
                     timeout=HTTP_TIMEOUT)
        assert r.status_code == 200, r.text
        sub = r.json()
        assert sub["name"] == SUB_DEVICE_NAME
        assert sub["type"] == SUB_DEVICE_TYPE
        sub_id = sub["id"]["id"]
        assert sub_id != gateway_id
        got = _latest(server, rest, sub_id, list(GW_VALUES))
        assert got == {k: [{"ts": GW_TS, "value": v}] for k, v in GW_VALUES.items()}
        for k, v in GW_VALUES.items():
            assert type(got[k][0]["value"]) is type(v), k
        # The gateway's own device got none of it: as in ThingsBoard, a key without
        # data comes back as one point with value null.
        own = _latest(server, rest, gateway_id, list(GW_VALUES))
        assert all(p["value"] is None for k in GW_VALUES for p in own.get(k, [])), own
    finally:
        gw.stop()
        gw.disconnect()


@pytest.mark.skipif(TBGatewayMqttClient is None, reason="this tb-mqtt-client has no tb_gateway_mqtt")
def test_gateway_client_attributes_rpc_claim_and_disconnect(server, rest):
    """Every other call of the SDK's gateway client, unchanged, for one sub-device."""
    base, token, sub_name = server["base"], "sdkGw2" + uuid.uuid4().hex[:10], "sdk-gw2-sub"
    _create_device(server, rest, token, {"name": "sdk-gw2", "type": "gateway", "additionalInfo": {"gateway": True}})
    gw = TBGatewayMqttClient("127.0.0.1", port=server["mqtt_port"], username=token)
    gw.connect()  # no callback: see the sdk fixture
    try:
        wait_until(gw.is_connected, "the gateway client to report a connection")
        _assert_published(gw.gw_connect_device(sub_name, device_type="valve"))
        _assert_published(gw.gw_send_attributes(sub_name, {"model": "V-2", "ports": 4}))
        r = rest.get(f"{base}/api/tenant/devices", params={"deviceName": sub_name}, timeout=HTTP_TIMEOUT)
        assert r.status_code == 200, r.text
        sub_id = r.json()["id"]["id"]

        # Shared attribute changes and deletions reach the gateway's subscriptions.
        every, one_device, one_key = Calls(), Calls(), Calls()
        assert gw.gw_subscribe_to_all_attributes(every)
        assert gw.gw_subscribe_to_all_device_attributes(sub_name, one_device)
        assert gw.gw_subscribe_to_attribute(sub_name, "target", one_key)
        _post_shared(server, rest, sub_id, {"target": 35, "unit": "C"})
        want = {"device": sub_name, "data": {"target": 35, "unit": "C"}}
        assert every.wait(what="the all-attributes callback")[0] == (want,)
        assert one_device.wait(what="the device callback")[0] == (want,)
        assert one_key.wait(what="the attribute callback")[0] == (want,)
        r = rest.delete(f"{base}/api/plugins/telemetry/DEVICE/{sub_id}/SHARED_SCOPE", params={"keys": "unit"},
                        timeout=HTTP_TIMEOUT)
        assert r.status_code == 200, r.text
        assert every.wait(count=2, what="the deletion")[1] == ({"device": sub_name, "data": {"deleted": ["unit"]}},)

        # Attribute requests, client and shared, one key and several.
        answers = Calls()
        _assert_published(gw.gw_request_shared_attributes(sub_name, ["target"], answers))
        _assert_published(gw.gw_request_client_attributes(sub_name, ["model", "ports"], answers))
        got = answers.wait(count=2, what="the attribute responses")
        by_id = sorted((content for content, _error in got), key=lambda c: c["id"])
        assert [c["device"] for c in by_id] == [sub_name, sub_name]
        assert by_id[0]["value"] == 35
        assert by_id[1]["values"] == {"model": "V-2", "ports": 4}

        # Server-side RPC to the sub-device, answered by the gateway.
        seen = []

        def handler(client, content):
            seen.append(content)
            client.gw_send_rpc_reply(content["device"], content["data"]["id"], {"opened": content["data"]["params"]})

        gw.gw_set_server_side_rpc_request_handler(handler)
        r = requests.post(f"{base}/api/plugins/rpc/twoway/{sub_id}", headers=rest.headers, timeout=HTTP_TIMEOUT,
                          json={"method": "open", "params": {"pct": 40}, "timeout": 30000})
        assert r.status_code == 200, r.text
        assert r.json() == {"opened": {"pct": 40}}
        assert seen[0]["device"] == sub_name and seen[0]["data"]["method"] == "open", seen

        # Claiming through the gateway, then a customer user claims with the secret.
        _assert_published(gw.gw_claim(sub_name, "gw-secret", 60000))
        user, _ = activated_customer_user(rest, base, "gw-claimers", "gw-claimer@compat.test", "gw-claimer-pw")
        r = requests.post(f"{base}/api/customer/device/{sub_name}/claim", json={"secretKey": "gw-secret"},
                          headers=user, timeout=HTTP_TIMEOUT)
        assert r.status_code == 200 and r.json()["response"] == "SUCCESS", r.text

        _assert_published(gw.gw_disconnect_device(sub_name))
    finally:
        gw.stop()
        gw.disconnect()


def test_sdk_provisioning_call(server, rest):
    # A profile that lets devices create themselves, then the SDK's own provisioning call,
    # unchanged; the credentials it returns work at once.
    key, secret = "sdk-key-" + uuid.uuid4().hex[:6], "sdk-secret-" + uuid.uuid4().hex[:6]
    profile = {"name": "sdk-provisioned", "provisionType": "ALLOW_CREATE_NEW_DEVICES", "provisionDeviceKey": key,
               "profileData": {"provisionConfiguration": {"type": "ALLOW_CREATE_NEW_DEVICES",
                                                          "provisionDeviceSecret": secret}}}
    r = rest.post(server["base"] + "/api/deviceProfile", json=profile, timeout=HTTP_TIMEOUT)
    assert r.status_code == 200, r.text
    credentials = TBDeviceMqttClient.provision("127.0.0.1", key, secret, port=server["mqtt_port"],
                                               device_name="sdk-provisioned-1")
    assert credentials is not None and credentials["status"] == "SUCCESS", credentials
    assert credentials["credentialsType"] == "ACCESS_TOKEN"
    token = credentials["credentialsValue"]
    r = requests.post(server["base"] + f"/api/v1/{token}/telemetry", json={"provisioned": True}, timeout=HTTP_TIMEOUT)
    assert r.status_code == 200, r.text
    # A wrong secret: the SDK gets no credentials.
    assert TBDeviceMqttClient.provision("127.0.0.1", key, "wrong", port=server["mqtt_port"],
                                        device_name="sdk-provisioned-2") is None


def test_sdk_connects_with_mqtt_basic_credentials(server, rest):
    # MQTT_BASIC credentials set over REST; the SDK connects with client id, user name and
    # password, unchanged, and its telemetry is stored.
    device = _create_device(server, rest, "basicTok" + uuid.uuid4().hex[:8], {"name": "sdk-basic"})
    value = {"clientId": "sdk-basic-client", "userName": "sdk-basic-user", "password": "sdk-basic-pw"}
    r = rest.post(f"{server['base']}/api/device/credentials", timeout=HTTP_TIMEOUT,
                  json={"deviceId": {"entityType": "DEVICE", "id": device}, "credentialsType": "MQTT_BASIC",
                        "credentialsValue": json.dumps(value)})
    assert r.status_code == 200, r.text
    client = TBDeviceMqttClient("127.0.0.1", port=server["mqtt_port"], username="sdk-basic-user",
                                password="sdk-basic-pw", client_id="sdk-basic-client")
    client.connect()
    try:
        wait_until(client.is_connected, "the SDK connected with MQTT_BASIC")
        _assert_published(client.send_telemetry({"basic": 1}))
        assert _latest(server, rest, device, ["basic"])["basic"][0]["value"] == 1
    finally:
        client.stop()
        client.disconnect()


def test_sdk_claim_call(server, rest, device_id, sdk):
    # The SDK's own claiming call, unchanged; then a customer user claims the device by name
    # with the secret, as ThingsBoard's claiming widget does.
    base = server["base"]
    user, customer = activated_customer_user(rest, base, "claimers", "claimer@compat.test", "claimer-pw")

    _assert_published(sdk.claim(secret_key="sdk-claim-secret", duration=60000))
    claim = f"{base}/api/customer/device/{DEVICE_NAME}/claim"
    r = requests.post(claim, json={"secretKey": "sdk-claim-secret"}, headers=user, timeout=HTTP_TIMEOUT)
    assert r.status_code == 200 and r.json()["response"] == "SUCCESS", r.text
    assert r.json()["device"]["customerId"]["id"] == customer["id"]
    r = requests.get(f"{base}/api/device/{device_id}", headers=user, timeout=HTTP_TIMEOUT)
    assert r.status_code == 200, r.text
    # Given back: the device is the tenant's again.
    assert requests.delete(claim, headers=user, timeout=HTTP_TIMEOUT).status_code == 200
    assert requests.get(f"{base}/api/device/{device_id}", headers=user, timeout=HTTP_TIMEOUT).status_code == 403
