"""CoAP clients written outside this project against a real gridlinks: aiocoap (PyPI) and
libcoap's coap-client (Debian's libcoap3-bin). ThingsBoard's CoAP device API: telemetry and
attributes posted (2.01 Created once durable), attributes read back (2.05 Content), a bad
token (4.01) and an unknown resource (4.04); Observe on shared attributes and on server-side
RPC with the device's answer completing the REST call; bodies sent in Block1 blocks and
answers read in Block2 blocks."""

import asyncio
import json
import os
import select
import shutil
import subprocess
import time

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


def set_shared(s, device_id, values):
    r = requests.post(s["base"] + f"/api/plugins/telemetry/DEVICE/{device_id}/attributes/SHARED_SCOPE",
                      json=values, headers=s["headers"])
    assert r.status_code == 200, r.text


def test_aiocoap_observes_attributes_and_rpc_and_answers_the_call(server):
    import aiocoap

    device_id = make_device(server, "aiocoap-observer", "AIOOBSTOKEN")
    set_shared(server, device_id, {"mode": "eco"})
    base = f"coap://127.0.0.1:{server['coap_port']}/api/v1/AIOOBSTOKEN"

    def rpc_call():
        return requests.post(server["base"] + f"/api/rpc/twoway/{device_id}", headers=server["headers"],
                             json={"method": "setDim", "params": {"level": 7}, "timeout": 10000})

    async def run():
        ctx = await aiocoap.Context.create_client_context()
        try:
            attrs = ctx.request(aiocoap.Message(code=aiocoap.GET, observe=0, uri=f"{base}/attributes"))
            first = await attrs.response
            notified = attrs.observation.__aiter__()
            await asyncio.to_thread(set_shared, server, device_id, {"mode": "boost"})
            update = await asyncio.wait_for(notified.__anext__(), 10)
            attrs.observation.cancel()

            rpc = ctx.request(aiocoap.Message(code=aiocoap.GET, observe=0, uri=f"{base}/rpc"))
            await rpc.response
            commands = rpc.observation.__aiter__()
            call = asyncio.create_task(asyncio.to_thread(rpc_call))
            command = await asyncio.wait_for(commands.__anext__(), 10)
            req = json.loads(command.payload)
            answer = aiocoap.Message(code=aiocoap.POST, uri=f"{base}/rpc/{req['id']}",
                                     payload=json.dumps({"dim": 7}).encode())
            answered = await ctx.request(answer).response
            rpc.observation.cancel()
            return first, update, req, answered, await call
        finally:
            await ctx.shutdown()

    first, update, req, answered, call = asyncio.run(run())
    assert first.code == aiocoap.CONTENT and json.loads(first.payload) == {"mode": "eco"}, first
    assert first.opt.observe is not None
    assert json.loads(update.payload) == {"mode": "boost"}
    assert (req["method"], req["params"]) == ("setDim", {"level": 7})
    assert answered.code == aiocoap.CREATED, answered
    assert call.status_code == 200 and call.json() == {"dim": 7}, call.text


def test_aiocoap_sends_and_reads_bodies_in_blocks(server):
    import aiocoap

    device_id = make_device(server, "aiocoap-blocks", "AIOBLOCKTOKEN")
    base = f"coap://127.0.0.1:{server['coap_port']}/api/v1/AIOBLOCKTOKEN"
    # 3 KiB of telemetry in Block1 blocks; 2 KiB of attributes come back in Block2 blocks,
    # which aiocoap asks for and puts together itself.
    telemetry = {f"k{i:03}": i for i in range(300)}
    shared = {f"s{i:02}": "v" * 40 for i in range(40)}
    set_shared(server, device_id, shared)

    async def run():
        ctx = await aiocoap.Context.create_client_context()
        try:
            body = json.dumps(telemetry).encode()
            assert len(body) > 3000
            # aiocoap sends a large body whole over UDP; the blocks are made with its own
            # option type, 1 KiB each (szx 6), and sent one by one.
            chunks = [body[i:i + 1024] for i in range(0, len(body), 1024)]
            answers = []
            for n, chunk in enumerate(chunks):
                block = aiocoap.Message(code=aiocoap.POST, uri=f"{base}/telemetry", payload=chunk)
                block.opt.block1 = aiocoap.optiontypes.BlockOption.BlockwiseTuple(n, n + 1 < len(chunks), 6)
                answers.append(await ctx.request(block, handle_blockwise=False).response)
            assert [a.code for a in answers[:-1]] == [aiocoap.CONTINUE] * (len(chunks) - 1), answers
            posted = answers[-1]
            read = await ctx.request(aiocoap.Message(code=aiocoap.GET, uri=f"{base}/attributes")).response
            return posted, read
        finally:
            await ctx.shutdown()

    posted, read = asyncio.run(run())
    assert posted.code == aiocoap.CREATED, posted
    assert posted.opt.block1.block_number == 3 and not posted.opt.block1.more, posted
    assert latest(server, device_id, "k000,k299") == {"k000": 0, "k299": 299}
    assert read.code == aiocoap.CONTENT, read
    assert len(read.payload) > 1024
    assert json.loads(read.payload) == {"shared": shared}


def payloads(out):
    """The whole JSON values in coap-client's output (it prints each payload as it comes,
    without a separator); a value still being written is left out."""
    decoder, seen, at = json.JSONDecoder(), [], out.find("{")
    while at >= 0:
        try:
            value, end = decoder.raw_decode(out, at)
        except json.JSONDecodeError:
            break
        seen.append(value)
        at = out.find("{", end)
    return seen


@pytest.mark.skipif(shutil.which("coap-client-notls") is None, reason="libcoap3-bin not installed (make deps)")
def test_libcoap_client_observes_attributes_and_posts_in_blocks(server, tmp_path):
    device_id = make_device(server, "libcoap-observer", "LIBOBSTOKEN")
    set_shared(server, device_id, {"mode": "eco"})
    base = f"coap://127.0.0.1:{server['coap_port']}/api/v1/LIBOBSTOKEN"
    # Observe: the update is made once the current value is printed (the observation is
    # registered: awaited, not a guessed pause), and the watcher stopped once the update is
    # in; 60 s is only a hang guard. stdbuf: coap-client's output unbuffered, as it comes.
    watcher = subprocess.Popen(["stdbuf", "-o0", "coap-client-notls", "-m", "get", "-s", "60", f"{base}/attributes"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, seen, err = "", [], b""
    try:
        deadline = time.monotonic() + 60
        while len(seen) < 2 and time.monotonic() < deadline:
            if select.select([watcher.stdout], [], [], 0.1)[0]:
                chunk = os.read(watcher.stdout.fileno(), 4096)
                if not chunk:
                    break
                out += chunk.decode(errors="replace")
                updated = len(seen) >= 1
                seen = payloads(out)
                if seen and not updated:
                    set_shared(server, device_id, {"mode": "night"})
    finally:
        watcher.kill()
        err = watcher.communicate()[1]
    assert seen[:2] == [{"mode": "eco"}, {"mode": "night"}], (out, err)
    # A 2 KiB body sent in 64-byte blocks (-b 64).
    body = tmp_path / "body.json"
    body.write_text(json.dumps({f"b{i:03}": i for i in range(200)}))
    out = subprocess.run(["coap-client-notls", "-B", "10", "-b", "64", "-m", "post", "-f", str(body),
                          f"{base}/telemetry"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert latest(server, device_id, "b000,b199") == {"b000": 0, "b199": 199}
