"""Compatibility test: OTA updates end to end with ThingsBoard's own clients, unchanged.

tb-rest-client 4.4 creates the package, uploads its file with a checksum, lists, reads,
downloads and deletes it; the firmware is assigned through the device profile (as
ThingsBoard's UI does); then tb-mqtt-client's own firmware update (`get_firmware_update`:
the `fw_*` shared attributes, chunks over `v2/fw/request/…`, checksum check, `fw_state`
reports) and the HTTP client's (`TBHTTPDevice.get_firmware_update`, chunks over
`GET /api/v1/{token}/firmware`) run against GridLinks, and their reports are read back;
aiocoap reads the CoAP firmware resource.
"""

import hashlib
import os
import uuid

import pytest
import requests

from gridlinks_server import gridlinks_server, wait_until
from tb_device_http import TBHTTPDevice
from tb_device_mqtt import TBDeviceMqttClient, TBFirmwareState
from tb_rest_client.rest import ApiException
from tb_rest_client.rest_client import RestClient as TbRestClient
from tb_rest_client.models import SaveOtaPackageInfoRequest

ADMIN_PASSWORD = "ota-pw-" + uuid.uuid4().hex[:8]
FIRMWARE = os.urandom(5000)  # five 1,000-byte chunks
TITLE, VERSION = "thermo-fw", "2.4.1"
WAIT_S = 60  # a hang guard




@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with gridlinks_server(tmp_path_factory.mktemp("gridlinks-ota"), ADMIN_PASSWORD) as s:
        yield s


@pytest.fixture(scope="module")
def rest(server):
    c = TbRestClient(base_url=server["base"])
    c.login(username="admin", password=ADMIN_PASSWORD)
    yield c
    c.stop()


@pytest.fixture(scope="module")
def jwt(rest):
    return {"X-Authorization": "Bearer " + rest.get_token()}


@pytest.fixture(scope="module")
def package(server, rest, tmp_path_factory):
    profile = rest.get_default_device_profile_info()
    info = rest.save_ota_package_info(SaveOtaPackageInfoRequest(
        title=TITLE, version=VERSION, type="FIRMWARE", device_profile_id=profile.id, uses_url=False))
    assert info.id.id and info.has_data is False
    path = tmp_path_factory.mktemp("fw") / "thermo.bin"
    path.write_bytes(FIRMWARE)
    with pytest.raises(ApiException) as wrong:
        rest.save_ota_package_data(info.id, "SHA256", str(path), checksum="00" * 32)
    assert wrong.value.status == 400
    sha = hashlib.sha256(FIRMWARE).hexdigest()
    info = rest.save_ota_package_data(info.id, "SHA256", str(path), checksum=sha)
    assert (info.has_data, info.checksum, info.data_size, info.file_name) == (True, sha, len(FIRMWARE), "thermo.bin")
    return info, profile


def test_rest_client_reads_lists_and_downloads(server, rest, package, jwt):
    info, profile = package
    assert rest.get_ota_package_info_by_id(info.id).title == TITLE
    assert rest.get_ota_package_by_id(info.id).version == VERSION
    page = rest.get_ota_packages(page_size=10, page=0)
    assert [p.id.id for p in page.data] == [info.id.id]
    page = rest.get_ota_packages_v1(profile.id, "FIRMWARE", page_size=10, page=0)
    assert [p.id.id for p in page.data] == [info.id.id]
    assert rest.get_ota_packages_v1(profile.id, "SOFTWARE", page_size=10, page=0).data == []
    r = requests.get(f"{server['base']}/api/otaPackage/{info.id.id}/download", headers=jwt, timeout=WAIT_S)
    assert r.status_code == 200 and r.content == FIRMWARE


def _assign(server, jwt, profile_id, package_id):
    base = server["base"]
    doc = requests.get(f"{base}/api/deviceProfile/{profile_id}", headers=jwt, timeout=WAIT_S).json()
    doc["firmwareId"] = {"entityType": "OTA_PACKAGE", "id": package_id} if package_id else None
    r = requests.post(f"{base}/api/deviceProfile", json=doc, headers=jwt, timeout=WAIT_S)
    assert r.status_code == 200, r.text
    return r.json()


def _device(server, jwt, name):
    token = "otaTok" + uuid.uuid4().hex[:12]
    r = requests.post(f"{server['base']}/api/device", params={"accessToken": token}, json={"name": name},
                      headers=jwt, timeout=WAIT_S)
    assert r.status_code == 200, r.text
    return r.json()["id"]["id"], token


def _fw_state(server, jwt, device_id):
    r = requests.get(f"{server['base']}/api/plugins/telemetry/DEVICE/{device_id}/values/timeseries",
                     params={"keys": "fw_state,current_fw_version"}, headers=jwt, timeout=WAIT_S)
    assert r.status_code == 200, r.text
    return {k: v[0]["value"] for k, v in r.json().items() if v and v[0]["value"] is not None}


def test_mqtt_client_firmware_update(server, package, jwt, tmp_path, monkeypatch):
    info, profile = package
    assert _assign(server, jwt, profile.id.id, info.id.id)["firmwareId"]["id"] == info.id.id
    device_id, token = _device(server, jwt, "ota-mqtt")
    monkeypatch.chdir(tmp_path)  # the SDK's default callback writes the file under its title
    received = []

    def on_firmware(c, data, version):
        received.append((data, version))
        c.update_firmware_info(title=TITLE, version=version, state=TBFirmwareState.UPDATED)

    client = TBDeviceMqttClient("127.0.0.1", port=server["mqtt_port"], username=token, chunk_size=1000)
    client.set_on_firmware_received_callback(on_firmware)
    client.connect()
    try:
        wait_until(client.is_connected, "the SDK's connection")
        client.get_firmware_update()
        wait_until(lambda: received, "the firmware to be downloaded and verified")
        assert received[0] == (FIRMWARE, VERSION)
        wait_until(lambda: _fw_state(server, jwt, device_id).get("fw_state") == "UPDATED", "fw_state UPDATED")
        assert _fw_state(server, jwt, device_id)["current_fw_version"] == VERSION
    finally:
        client.stop()
        client.disconnect()


def test_http_client_firmware_update(server, package, jwt, tmp_path, monkeypatch):
    device_id, token = _device(server, jwt, "ota-http")
    monkeypatch.chdir(tmp_path)  # the client writes the file under its title
    client = TBHTTPDevice(server["base"], token, chunk_size=1000)
    assert client.connect()
    client.get_firmware_update()
    assert (tmp_path / TITLE).read_bytes() == FIRMWARE
    wait_until(lambda: _fw_state(server, jwt, device_id).get("fw_state") == "UPDATED", "fw_state UPDATED")
    client.stop_publish_worker()


def test_coap_download_in_blocks(server, package, jwt):
    """ThingsBoard's CoAP firmware resource, `/fw/{token}`, read by aiocoap (Block2)."""
    import asyncio

    import aiocoap

    _device_id, token = _device(server, jwt, "ota-coap")
    base = f"coap://127.0.0.1:{server['coap_port']}/fw/{token}"

    async def run():
        ctx = await aiocoap.Context.create_client_context()
        try:
            out = []
            for query in [f"?title={TITLE}&version={VERSION}", "?size=1000&chunk=4", "?title=other", "?size=-1"]:
                out.append(await ctx.request(aiocoap.Message(code=aiocoap.GET, uri=base + query)).response)
            return out
        finally:
            await ctx.shutdown()

    whole, last, other, bad = asyncio.run(run())
    assert whole.code == aiocoap.CONTENT and whole.payload == FIRMWARE
    assert last.code == aiocoap.CONTENT and last.payload == FIRMWARE[4000:]
    assert other.code == aiocoap.BAD_REQUEST and bad.code == aiocoap.BAD_REQUEST


def test_unassigned_package_is_deleted(server, rest, package, jwt):
    info, profile = package
    with pytest.raises(ApiException) as in_use:
        rest.delete_ota_package(info.id)
    assert in_use.value.status == 400
    _assign(server, jwt, profile.id.id, None)
    rest.delete_ota_package(info.id)
    with pytest.raises(ApiException) as gone:
        rest.get_ota_package_info_by_id(info.id)
    assert gone.value.status == 404
