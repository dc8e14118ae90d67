"""Starts and stops a real gridlinks for the compatibility tests.

GRIDLINKS_BIN selects the binary (default: target/debug/gridlinks of this repository).
"""

import contextlib
import os
import random
import signal
import socket
import subprocess
import time

import pytest
import requests

GRIDLINKS_BIN = os.environ.get(
    "GRIDLINKS_BIN",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "target", "debug", "gridlinks"))


WAIT_S = 60  # the bound of every wait of the compatibility tests: a hang guard


def wait_until(predicate, what, timeout=WAIT_S, interval=0.05):
    """The predicate's first true value, polled every `interval`; fails the test after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def activated_customer_user(rest, base, customer_title, email, password):
    """A customer user of a new customer, activated; its request headers and the customer id."""
    r = rest.post(base + "/api/customer", json={"title": customer_title}, timeout=WAIT_S)
    assert r.status_code == 200, r.text
    customer = r.json()["id"]
    r = rest.post(base + "/api/user", params={"sendActivationMail": "false"}, timeout=WAIT_S,
                  json={"email": email, "authority": "CUSTOMER_USER", "customerId": customer})
    assert r.status_code == 200, r.text
    link = rest.get(f"{base}/api/user/{r.json()['id']['id']}/activationLink", timeout=WAIT_S).text
    r = requests.post(base + "/api/noauth/activate", timeout=WAIT_S,
                      json={"activateToken": link.split("activateToken=")[1], "password": password})
    assert r.status_code == 200, r.text
    return {"X-Authorization": "Bearer " + r.json()["token"]}, customer


def free_port(kind=socket.SOCK_STREAM):
    """A free loopback port (TCP, or UDP with kind=socket.SOCK_DGRAM) below Linux's
    ephemeral range (32768-60999): client sockets of tests running meanwhile cannot take it
    before the server binds it."""
    while True:
        port = random.randint(10000, 31999)
        with socket.socket(socket.AF_INET, kind) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


@contextlib.contextmanager
def gridlinks_server(tmp, admin_password, **env):
    """Runs gridlinks on free loopback ports with its data in `tmp`; yields
    {"base": http url, "mqtt_port": int, "ws_port": int, "coap_port": int (UDP), "log": path}. On exit it sends SIGTERM and
    asserts a clean exit (code 0 within 20 s)."""
    if not os.access(GRIDLINKS_BIN, os.X_OK):
        pytest.fail(f"gridlinks binary not found or not executable: {GRIDLINKS_BIN} (set GRIDLINKS_BIN)")
    log_path = tmp / "server.log"
    for _ in range(5):
        port, mqtt_port, ws_port, coap_port = free_port(), free_port(), free_port(), free_port(socket.SOCK_DGRAM)
        log = open(log_path, "wb")
        proc = subprocess.Popen(
            [GRIDLINKS_BIN, "serve", "--data-dir", str(tmp / "data"),
             "--http-bind", f"127.0.0.1:{port}", "--mqtt-bind", f"127.0.0.1:{mqtt_port}",
             "--mqtt-ws-bind", f"127.0.0.1:{ws_port}", "--coap-bind", f"127.0.0.1:{coap_port}"],
            stdout=log, stderr=subprocess.STDOUT,
            env=dict(os.environ, GRIDLINKS_ADMIN_PASSWORD=admin_password, **env),
        )
        base = f"http://127.0.0.1:{port}"
        if _wait_healthy(proc, base, log, log_path):
            break
        # A port was taken meanwhile (another test's server): try other ports.
    else:
        pytest.fail(f"gridlinks did not start in 5 attempts:\n{log_path.read_text(errors='replace')}")

    yield {"base": base, "mqtt_port": mqtt_port, "ws_port": ws_port, "coap_port": coap_port, "log": log_path}

    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        log.close()
        pytest.fail("gridlinks did not stop within 20 s of SIGTERM")
    log.close()
    assert rc == 0, f"gridlinks exited with {rc} after SIGTERM:\n{log_path.read_text(errors='replace')}"


def _wait_healthy(proc, base, log, log_path):
    """True once /healthz answers 200; False if gridlinks exited because a port was taken."""
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            log.close()
            text = log_path.read_text(errors='replace')
            if "Address already in use" in text:
                return False
            pytest.fail(f"gridlinks exited early with {proc.returncode}:\n{text}")
        try:
            if requests.get(base + "/healthz", timeout=1).status_code == 200:
                return True
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            log.close()
            pytest.fail(f"gridlinks not healthy within 60 s:\n{log_path.read_text(errors='replace')}")
        time.sleep(0.1)
