"""Compatibility test: tb-rest-client's tenant profile calls, as ThingsBoard's system
administrator makes them, against a real GridLinks; then the limits such a profile sets
hold for a tenant that has it: tb-mqtt-client learns its device's rates from getSessionLimits
and paces itself; paho, which does not, is refused past them.

Every tenant profile method of the client's `RestClient` is called here and what it returns
is checked: save (create, update), get by id, info by id, default info, set default,
pages of profiles and of infos, the list by ids, delete.
"""

import json
import threading
import uuid

import paho.mqtt.client as mqtt
import pytest
import requests
from tb_device_mqtt import TBDeviceMqttClient
from tb_rest_client.models import (
    DefaultTenantProfileConfiguration,
    Device,
    Tenant,
    TenantProfile,
    TenantProfileData,
    TenantProfileId,
)
from tb_rest_client.rest import ApiException
from tb_rest_client.rest_client import RestClient

from gridlinks_server import gridlinks_server, wait_until

ADMIN_PASSWORD = "compat-" + uuid.uuid4().hex[:8]
SYSADMIN_PASSWORD = "compat-sys-" + uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with gridlinks_server(tmp_path_factory.mktemp("profiles"), ADMIN_PASSWORD,
                          GRIDLINKS_ADMIN_SYSADMIN_PASSWORD=SYSADMIN_PASSWORD) as s:
        yield s


@pytest.fixture(scope="module")
def sys(server):
    c = RestClient(base_url=server["base"])
    c.login(username="sysadmin", password=SYSADMIN_PASSWORD)
    yield c
    c.stop()


def _profile(name, **limits):
    return TenantProfile(name=name, description=f"{name} tenants",
                         profile_data=TenantProfileData(configuration=DefaultTenantProfileConfiguration(type="DEFAULT", **limits)))


def test_tenant_profile_methods(sys):
    default = sys.get_default_tenant_profile_info()
    assert default.name == "Default"
    small = sys.save_tenant_profile(_profile("small", max_devices=5, transport_device_msg_rate_limit="10:1"))
    assert small.id.id and small.default is False
    assert small.profile_data.configuration.max_devices == 5
    small.description = "the small ones"
    small = sys.save_tenant_profile(small)
    got = sys.get_tenant_profile_by_id(small.id)
    assert (got.name, got.description) == ("small", "the small ones")
    assert got.profile_data.configuration.transport_device_msg_rate_limit == "10:1"
    assert sys.get_tenant_profile_info_by_id(small.id).name == "small"
    names = [p.name for p in sys.get_tenant_profiles(page_size=10, page=0).data]
    assert names == ["Default", "small"]
    infos = sys.get_tenant_profile_infos(page_size=10, page=0, text_search="sma")
    assert [i.name for i in infos.data] == ["small"]
    listed = sys.get_tenant_profiles_by_ids([small.id.id, default.id.id])
    assert sorted(p.name for p in listed) == ["Default", "small"]

    made = sys.set_default_tenant_profile(small.id)
    assert made.default is True
    assert sys.get_default_tenant_profile_info().id.id == small.id.id
    with pytest.raises(ApiException) as e:
        sys.delete_tenant_profile(small.id)
    assert e.value.status == 400  # the default
    sys.set_default_tenant_profile(TenantProfileId(default.id.id, "TENANT_PROFILE"))
    spare = sys.save_tenant_profile(_profile("spare"))
    sys.delete_tenant_profile(spare.id)
    with pytest.raises(ApiException) as e:
        sys.get_tenant_profile_by_id(spare.id)
    assert e.value.status == 404


def test_a_profiles_rate_limit_holds_for_the_sdk(server, sys):
    limited = sys.save_tenant_profile(
        _profile("metered", transport_device_telemetry_msg_rate_limit="2:3600"))
    tenant = sys.save_tenant(Tenant(title="Metered", tenant_profile_id=limited.id))
    assert tenant.tenant_profile_id.id == limited.id.id
    # The tenant's administrator, activated by its link, makes a device.
    base = server["base"]
    auth = {"X-Authorization": "Bearer " + sys.token_info["token"]}
    user = requests.post(f"{base}/api/user?sendActivationMail=false", headers=auth, timeout=30,
                         json={"email": "boss@metered.test", "authority": "TENANT_ADMIN",
                               "tenantId": {"entityType": "TENANT", "id": tenant.id.id}}).json()
    link = requests.get(f"{base}/api/user/{user['id']['id']}/activationLink", headers=auth, timeout=30).text
    token = link.split("activateToken=")[1]
    r = requests.post(f"{base}/api/noauth/activate", json={"activateToken": token, "password": "metered-Pw-1"},
                      timeout=30)
    assert r.status_code == 200, r.text
    admin = RestClient(base_url=base)
    admin.login(username="boss@metered.test", password="metered-Pw-1")
    device = admin.save_device(Device(name="meter", type="default"), access_token="METERED-TOKEN")

    # tb-mqtt-client asks getSessionLimits on connect and paces itself by the device's
    # rates in the answer.
    sdk = TBDeviceMqttClient("127.0.0.1", port=server["mqtt_port"], username="METERED-TOKEN")
    sdk.connect()
    try:
        wait_until(lambda: sdk.is_connected() and sdk.rate_limits_received, "the SDK's session limits")
        assert sdk._telemetry_rate_limit.has_limit()  # pylint: disable=protected-access
    finally:
        sdk.stop()
        sdk.disconnect()

    # paho (MQTT 3.1.1), which does not: two points taken; the third is refused by closing
    # the connection (3.1.1 has no negative acknowledgement) and is not stored.
    closed = threading.Event()
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv311)
    client.username_pw_set("METERED-TOKEN")
    client.on_disconnect = lambda *a: closed.set()
    client.connect("127.0.0.1", server["mqtt_port"])
    client.loop_start()
    try:
        for n in (1, 2):
            # Explicit timestamps: two points on one key in the same millisecond are one point.
            info = client.publish("v1/devices/me/telemetry", json.dumps({"ts": 1000 + n, "values": {"n": n}}),
                                  qos=1)
            info.wait_for_publish(timeout=30)
            assert info.is_published()
        client.publish("v1/devices/me/telemetry", json.dumps({"n": 3}), qos=1)
        assert closed.wait(30), "the connection closed past the limit"
    finally:
        client.loop_stop()
    metrics = requests.get(f"{base}/metrics", timeout=30).text
    assert 'gridlinks_tenant_limit_refusals_total{limit="transportDeviceTelemetryMsgRateLimit"} 1' in metrics
    stored = admin.get_timeseries(device.id, keys="n", start_ts=0, end_ts=2**62, limit=100)
    admin.stop()
    assert sorted(p.value for p in stored["n"]) == ["1", "2"], stored
