"""CoAP clients written outside this project against a real gridlinks: aiocoap (PyPI) and
libcoap's coap-client (Debian's libcoap3-bin). ThingsBoard's CoAP device API: telemetry and
attributes posted (2.01 Created once durable), attributes read back (2.05 Content), a bad
token (4.01) and an unknown resource (4.04)."""

import asyncio
import json
import shutil
import subprocess

import pytest
import requests

from gridlinks_server import gridlinks_server

ADMIN_PASSWORD = "coap-compat-pw"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with gridlinks_server(tmp_path_factory.mktemp("gridlinks-coap"), ADMIN_PASSWORD) as s:
        jwt = requests.post(s["base"] + "/api/auth/login",
                            json={"username": "admin", "password": ADMIN_PASSWORD}).json()["token"]
        s["headers"] = {"X-Authorization": f"Bearer {jwt}"}
        yield s


def make_device(s, name, token):
    r = requests.post(s["base"] + f"/api/device?accessToken={token}", json={"name": name}, headers=s["headers"])
    assert r.status_code == 200, r.text
    return r.json()["id"]["id"]


def latest(s, device_id, keys):
    r = requests.get(s["base"] + f"/api/plugins/telemetry/DEVICE/{device_id}/values/timeseries",
                     params={"keys": keys, "useStrictDataTypes": "true"}, headers=s["headers"])
    assert r.status_code == 200, r.text
    return {k: v[0]["value"] for k, v in r.json().items()}


def test_aiocoap_posts_telemetry_and_attributes_and_reads_attributes(server):
    import aiocoap

    device_id = make_device(server, "aiocoap-device", "AIOCOAPTOKEN")
    base = f"coap://127.0.0.1:{server['coap_port']}/api/v1"

    async def run():
        ctx = await aiocoap.Context.create_client_context()
        try:
            telemetry = aiocoap.Message(code=aiocoap.POST, uri=f"{base}/AIOCOAPTOKEN/telemetry",
                                        payload=json.dumps({"temperature": 21.5, "seq": 1}).encode())
            r1 = await ctx.request(telemetry).response
            attrs = aiocoap.Message(code=aiocoap.POST, uri=f"{base}/AIOCOAPTOKEN/attributes",
                                    payload=json.dumps({"firmware": "1.2.3"}).encode())
            r2 = await ctx.request(attrs).response
            read = aiocoap.Message(code=aiocoap.GET, uri=f"{base}/AIOCOAPTOKEN/attributes?clientKeys=firmware")
            r3 = await ctx.request(read).response
            bad = aiocoap.Message(code=aiocoap.POST, uri=f"{base}/NOT-A-TOKEN/telemetry", payload=b'{"a":1}')
            r4 = await ctx.request(bad).response
            # Non-confirmable: answered with a non-confirmable response.
            non = aiocoap.Message(code=aiocoap.POST, transport_tuning=aiocoap.Unreliable,
                                  uri=f"{base}/AIOCOAPTOKEN/telemetry",
                                  payload=b'{"seq":2}')
            r5 = await ctx.request(non).response
            return r1, r2, r3, r4, r5
        finally:
            await ctx.shutdown()

    r1, r2, r3, r4, r5 = asyncio.run(run())
    assert r1.code == aiocoap.CREATED, r1
    assert r2.code == aiocoap.CREATED, r2
    assert r3.code == aiocoap.CONTENT, r3
    assert json.loads(r3.payload) == {"client": {"firmware": "1.2.3"}}
    assert r4.code == aiocoap.UNAUTHORIZED, r4
    assert r5.code == aiocoap.CREATED and r5.mtype == aiocoap.NON, r5
    assert latest(server, device_id, "temperature,seq") == {"temperature": 21.5, "seq": 2}


@pytest.mark.skipif(shutil.which("coap-client-notls") is None, reason="libcoap3-bin not installed (make deps)")
def test_libcoap_client_posts_telemetry_and_reads_attributes(server):
    device_id = make_device(server, "libcoap-device", "LIBCOAPTOKEN")
    base = f"coap://127.0.0.1:{server['coap_port']}/api/v1"

    def coap_client(*args):
        return subprocess.run(["coap-client-notls", "-B", "5", *args], capture_output=True, text=True, timeout=30)

    out = coap_client("-m", "post", "-e", '{"humidity":40}', f"{base}/LIBCOAPTOKEN/telemetry")
    assert out.returncode == 0, out.stderr
    assert latest(server, device_id, "humidity") == {"humidity": 40}
    out = coap_client("-m", "post", "-e", '{"model":"X1"}', f"{base}/LIBCOAPTOKEN/attributes")
    assert out.returncode == 0, out.stderr
    out = coap_client("-m", "get", f"{base}/LIBCOAPTOKEN/attributes?clientKeys=model")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip()) == {"client": {"model": "X1"}}
    # An unknown resource: libcoap prints the 4.04 it got.
    out = coap_client("-m", "get", f"{base}/LIBCOAPTOKEN/nothing")
    assert "4.04" in out.stdout + out.stderr, out
