"""Compatibility test: ThingsBoard's own clients, and paho, over TLS.

GridLinks serves MQTT over TLS, MQTT over secure WebSocket and HTTPS with a certificate
made here by the openssl command line (a test CA, a server certificate for localhost, a
device's self-signed certificate). tb-mqtt-client connects over TLS with a token and with a
device's X.509 certificate (its own `connect(tls=True, cert_file=, key_file=)`);
tb-rest-client talks HTTPS; paho publishes over wss://, by token and by a device certificate.
"""

import json
import ssl
import subprocess
import uuid

import paho.mqtt.client as mqtt
import pytest
import requests

from gridlinks_server import free_port, gridlinks_server, wait_until

from tb_device_mqtt import TBDeviceMqttClient
from tb_rest_client.models import Device
from tb_rest_client.rest_client import RestClient

ADMIN_PASSWORD = "tls-pw-" + uuid.uuid4().hex[:8]
TOKEN = "tlsTok" + uuid.uuid4().hex[:12]
EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]


def _openssl(cwd, *args):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    _openssl(d, "req", "-x509", *EC, "-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=test CA", "-days", "30")
    (d / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    _openssl(d, "req", "-new", *EC, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost")
    _openssl(d, "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "30", "-extfile", "san.ext", "-out", "server.pem")
    for name in ("device", "wss-device"):
        _openssl(d, "req", "-x509", *EC, "-keyout", f"{name}.key", "-out", f"{name}.pem", "-subj", f"/CN={name}",
                 "-days", "30")
    return d


@pytest.fixture(scope="module")
def server(tmp_path_factory, pki):
    ports = {"https": free_port(), "mqtts": free_port(), "wss": free_port()}
    env = {
        "GRIDLINKS_TLS_CERT_FILE": str(pki / "server.pem"),
        "GRIDLINKS_TLS_KEY_FILE": str(pki / "server.key"),
        "GRIDLINKS_HTTP_TLS_BIND": f"127.0.0.1:{ports['https']}",
        "GRIDLINKS_MQTT_TLS_BIND": f"127.0.0.1:{ports['mqtts']}",
        "GRIDLINKS_MQTT_WSS_BIND": f"127.0.0.1:{ports['wss']}",
        "GRIDLINKS_MQTT_WSS_CLIENT_CERTS": "true",
    }
    with gridlinks_server(tmp_path_factory.mktemp("tls"), ADMIN_PASSWORD, **env) as s:
        yield dict(s, **ports)


@pytest.fixture(scope="module")
def rest(server, pki):
    """tb-rest-client over HTTPS, trusting the test CA (its login goes through `requests`,
    which reads REQUESTS_CA_BUNDLE; its API calls through urllib3, `ssl_ca_cert`)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("REQUESTS_CA_BUNDLE", str(pki / "ca.pem"))
        client = RestClient(base_url=f"https://localhost:{server['https']}")
        client.configuration.ssl_ca_cert = str(pki / "ca.pem")
        client.login(username="admin", password=ADMIN_PASSWORD)
    return client


def _device(server, rest, name, token=None):
    return rest.save_device(Device(name=name, type="default"), access_token=token).id


def _values(server, rest, device_id, key):
    data = rest.get_latest_timeseries(entity_id=device_id, keys=key)
    return [p.value for p in data.get(key, [])]


def _sdk_sends(server, pki, rest, device_id, key, token=None, cert=False):
    """tb-mqtt-client connects over TLS (by `token`, or by the device certificate) and sends
    {key: 7}, which is then stored under `device_id`."""
    client = TBDeviceMqttClient("localhost", port=server["mqtts"], username=token)
    kwargs = {"cert_file": str(pki / "device.pem"), "key_file": str(pki / "device.key")} if cert else {}
    client.connect(tls=True, ca_certs=str(pki / "ca.pem"), **kwargs)
    try:
        wait_until(client.is_connected, "the SDK to connect over TLS")
        assert client.send_telemetry({key: 7}).get() == 0
        wait_until(lambda: _values(server, rest, device_id, key) == ["7"], f"{key} stored under its device")
    finally:
        client.stop()
        client.disconnect()


def test_rest_client_over_https(server, rest):
    assert rest.get_user().email  # logged in over HTTPS; tokens come back over it


def test_sdk_over_tls_with_a_token(server, pki, rest):
    device_id = _device(server, rest, "sdk-tls", TOKEN)
    _sdk_sends(server, pki, rest, device_id, "tls", token=TOKEN)


def _x509_device(server, pki, rest, name, cert):
    device_id = _device(server, rest, name)
    pem = (pki / f"{cert}.pem").read_text()
    r = requests.post(f"{server['base']}/api/device/credentials", timeout=30,
                      headers={"X-Authorization": "Bearer " + rest.token_info["token"]},
                      json={"deviceId": {"entityType": "DEVICE", "id": device_id.id},
                            "credentialsType": "X509_CERTIFICATE", "credentialsValue": pem})
    assert r.status_code == 200, r.text
    return device_id


def test_sdk_over_tls_with_an_x509_certificate(server, pki, rest):
    device_id = _x509_device(server, pki, rest, "sdk-x509", "device")
    _sdk_sends(server, pki, rest, device_id, "x509", cert=True)


def _paho_wss_sends(server, pki, rest, device_id, key, token=None, cert=None):
    """paho connects over wss:// (by `token`, or by the certificate `cert`) and sends
    {key: 3}, which is then stored under `device_id`."""
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, transport="websockets", protocol=mqtt.MQTTv311)
    client.ws_set_options(path="/mqtt")
    files = {"certfile": str(pki / f"{cert}.pem"), "keyfile": str(pki / f"{cert}.key")} if cert else {}
    client.tls_set(ca_certs=str(pki / "ca.pem"), cert_reqs=ssl.CERT_REQUIRED, **files)
    if token:
        client.username_pw_set(token)
    client.connect("localhost", server["wss"])
    client.loop_start()
    try:
        info = client.publish("v1/devices/me/telemetry", json.dumps({key: 3}), qos=1)
        info.wait_for_publish(timeout=30)
        assert info.is_published()
        wait_until(lambda: _values(server, rest, device_id, key) == ["3"], f"{key} sent over wss://")
    finally:
        client.loop_stop()
        client.disconnect()


def test_paho_over_secure_websocket(server, pki, rest):
    device_id = _device(server, rest, "paho-wss", "wss" + TOKEN)
    _paho_wss_sends(server, pki, rest, device_id, "wss", token="wss" + TOKEN)


def test_paho_over_secure_websocket_with_an_x509_certificate(server, pki, rest):
    # No user name: the certificate names the device.
    device_id = _x509_device(server, pki, rest, "paho-wss-x509", "wss-device")
    _paho_wss_sends(server, pki, rest, device_id, "wssx509", cert="wss-device")
