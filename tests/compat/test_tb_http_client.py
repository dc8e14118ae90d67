"""Compatibility test: ThingsBoard's HTTP device client (`tb_device_http.TBHTTPDevice`,
from PyPI `tb-mqtt-client`, pinned in requirements.txt) against GridLinks, unchanged.

Every public call of the client: connect (its connection test posts `{}`), telemetry
(queued and direct), attributes, attribute reads, client-side RPC, and the long-poll
subscriptions to server-side RPC and shared-attribute updates with the device's answers.
The test starts its own gridlinks on free loopback ports, creates the device over REST and
reads the results back over REST.
"""

import time
import uuid

import pytest
import requests

from gridlinks_server import gridlinks_server, wait_until
from tb_device_http import TBHTTPDevice, TBProvisionFailure

ADMIN_PASSWORD = "http-pw-" + uuid.uuid4().hex[:8]
TOKEN = "httpTok" + uuid.uuid4().hex[:12]
WAIT_S = 60  # a hang guard




@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with gridlinks_server(tmp_path_factory.mktemp("gridlinks-http"), ADMIN_PASSWORD) as s:
        yield s


@pytest.fixture(scope="module")
def rest(server):
    r = requests.post(server["base"] + "/api/auth/login", json={"username": "admin", "password": ADMIN_PASSWORD},
                      timeout=WAIT_S)
    assert r.status_code == 200, r.text
    s = requests.Session()
    s.headers["X-Authorization"] = "Bearer " + r.json()["token"]
    yield s
    s.close()


@pytest.fixture(scope="module")
def device_id(server, rest):
    r = rest.post(server["base"] + "/api/device", params={"accessToken": TOKEN}, json={"name": "http-sdk-dev"},
                  timeout=WAIT_S)
    assert r.status_code == 200, r.text
    return r.json()["id"]["id"]


@pytest.fixture(scope="module")
def client(server, device_id):
    c = TBHTTPDevice(server["base"], TOKEN)
    assert c.connect(), "the client's connection test (POST {} to telemetry)"
    yield c
    c.stop_publish_worker()


def _latest(server, rest, device_id, keys):
    r = rest.get(f"{server['base']}/api/plugins/telemetry/DEVICE/{device_id}/values/timeseries",
                 params={"keys": ",".join(keys)}, timeout=WAIT_S)
    assert r.status_code == 200, r.text
    return r.json()


def test_telemetry_queued_and_direct(server, rest, device_id, client):
    client.send_telemetry({"queued": 1})
    client.send_telemetry({"direct": 2}, queued=False)
    assert _latest(server, rest, device_id, ["direct"])["direct"][0]["value"] == "2"
    wait_until(lambda: _latest(server, rest, device_id, ["queued"]).get("queued", [{}])[0].get("value") == "1",
                "the queued telemetry to be stored")


def test_attributes_sent_and_read(server, rest, device_id, client):
    client.send_attributes({"model": "H-1", "ports": 2})
    r = rest.post(f"{server['base']}/api/plugins/telemetry/DEVICE/{device_id}/SHARED_SCOPE",
                  json={"interval": 30}, timeout=WAIT_S)
    assert r.status_code == 200, r.text
    got = client.request_attributes(client_keys=["model"], shared_keys=["interval"])
    assert got == {"client": {"model": "H-1"}, "shared": {"interval": 30}}


def test_client_side_rpc(client):
    answer = client.send_rpc("getSessionLimits")
    assert answer["maxPayloadSize"] > 0, answer


def test_server_side_rpc_by_long_poll(server, rest, device_id, client):
    seen = []

    def on_rpc(request):
        seen.append(request)
        # The SDK's own way to answer: send_rpc with the request id.
        client.send_rpc("reply", {"done": request["params"]}, rpc_id=request["id"])

    client.subscribe("rpc", on_rpc)
    try:
        # 409 until the subscription's first poll has registered the device's poll session.
        def call():
            r = requests.post(f"{server['base']}/api/plugins/rpc/twoway/{device_id}",
                              headers=rest.headers, timeout=WAIT_S,
                              json={"method": "blink", "params": {"times": 3}, "timeout": 30000})
            return r if r.status_code != 409 else None

        r = wait_until(call, "the device's RPC poll")
        assert r.status_code == 200, r.text
        assert r.json() == {"method": "reply", "params": {"done": {"times": 3}}}
        assert seen[0]["method"] == "blink" and isinstance(seen[0]["id"], int), seen
    finally:
        client.unsubscribe("rpc")


def test_shared_attribute_updates_by_long_poll(server, rest, device_id, client):
    updates = []
    client.subscribe("attributes", updates.append)
    try:
        # A change made before the subscription's first poll registered the device's poll
        # session reaches nobody; changes go on until one arrives.
        def changed():
            r = rest.post(f"{server['base']}/api/plugins/telemetry/DEVICE/{device_id}/SHARED_SCOPE",
                          json={"interval": 60}, timeout=WAIT_S)
            assert r.status_code == 200, r.text
            time.sleep(0.2)
            return {"interval": 60} in updates

        wait_until(changed, "the attribute update")
    finally:
        client.unsubscribe("attributes")


def test_provisioning(server, rest):
    # The HTTP SDK's own provisioning call, unchanged: a device it creates, whose token
    # works at once; a wrong secret is its TBProvisionFailure.
    key, secret = "http-key-" + uuid.uuid4().hex[:6], "http-secret-" + uuid.uuid4().hex[:6]
    profile = {"name": "http-provisioned", "provisionType": "ALLOW_CREATE_NEW_DEVICES", "provisionDeviceKey": key,
               "profileData": {"provisionConfiguration": {"type": "ALLOW_CREATE_NEW_DEVICES",
                                                          "provisionDeviceSecret": secret}}}
    r = rest.post(server["base"] + "/api/deviceProfile", json=profile, timeout=WAIT_S)
    assert r.status_code == 200, r.text
    device = TBHTTPDevice.provision(server["base"], "http-provisioned-1", key, secret)
    device.send_telemetry({"provisioned": 1}, queued=False)  # raises on an error answer
    r = rest.get(server["base"] + "/api/tenant/devices", params={"deviceName": "http-provisioned-1"}, timeout=WAIT_S)
    assert r.status_code == 200 and r.json()["type"] == "http-provisioned", r.text
    assert _latest(server, rest, r.json()["id"]["id"], ["provisioned"])["provisioned"][0]["value"] == "1"
    with pytest.raises(TBProvisionFailure):
        TBHTTPDevice.provision(server["base"], "http-provisioned-2", key, "wrong")
